"""The operator's page (``/ui/``): Jinja2 templates and the page's own script and style."""
