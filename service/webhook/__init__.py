"""``ci-sizer webhook``: a mutating admission webhook that gives every CI pod of a labelled namespace its
job's answer, whatever runner made it (issue 37; docs/integrations/webhook.md).

- ``identity.py``: whose job a pod runs, from what each runner puts on its pods (or an operator's rules);
- ``sizer.py``: the answer, from the sizer's own sizing route over HTTP;
- ``patch.py``: the JSON patch, with the formats' rules (``fit_cpu``, sidecars, ``resizePolicy``);
- ``review.py``: one AdmissionReview, always allowed, patched only when the sizer is sure and in time;
- ``app.py`` and ``server.py``: the pure-ASGI app on uvicorn over TLS; ``certs.py``: a self-signed CA.
"""
