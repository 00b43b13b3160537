"""Fleet simulations (``/api/v1/simulations``): replay a trace of builds onto a node pool under each
placement profile, with and without ballast, and compare what each costs and how long builds wait.

``model`` holds the inputs and per-node/pod state, ``engine`` the discrete-event loop, ``trace``
the builds (synthetic or stored), ``report`` the figures, table and plot, ``service`` what the API
and the CLI call, ``router`` the routes. The names below are the package's public face."""

from service.simulations.engine import Event, Simulation, simulate
from service.simulations.model import Ballast, Build, Pool, Scenario, Shape
from service.simulations.report import plot, render
from service.simulations.service import auto_ballast, ballast_of, pool_of, run_all, scenarios_for
from service.simulations.trace import load_trace, pod_limits, recorded_sizes, synthetic, synthetic_from

__all__ = [
    "Ballast",
    "Build",
    "Event",
    "Pool",
    "Scenario",
    "Shape",
    "Simulation",
    "auto_ballast",
    "ballast_of",
    "load_trace",
    "plot",
    "pod_limits",
    "pool_of",
    "recorded_sizes",
    "render",
    "run_all",
    "scenarios_for",
    "simulate",
    "synthetic",
    "synthetic_from",
]
