"""ci-sizer: right-sizes Kubernetes requests and limits for CI jobs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ci-sizer")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"
