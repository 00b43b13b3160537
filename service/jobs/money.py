"""Money: the operator's prices turn capacity saved (GiB-hours, core-hours) into money.

The prices are set by the operator (``--price-per-gib-hour``, ``--price-per-core-hour``,
``--price-currency``, or ``CI_SIZER_PRICE_*``); nothing is looked up on the network. The defaults are
OpenCost's default custom prices (``configs/default.json`` in opencost/opencost, "based on GCP
us-central1": ``"CPU": "0.031611"`` per core-hour, ``"RAM": "0.004237"`` per GiB-hour). A month is
730 hours (365 x 24 / 12), as cloud price sheets count it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: OpenCost's configs/default.json ("CPU", "RAM"), per hour
DEFAULT_PRICE_PER_CORE_HOUR = 0.031611
DEFAULT_PRICE_PER_GIB_HOUR = 0.004237
DEFAULT_CURRENCY = "USD"
#: days in a month: 730 hours
MONTH_DAYS = 730 / 24


@dataclass(frozen=True)
class Prices:
    per_gib_hour: float = DEFAULT_PRICE_PER_GIB_HOUR
    per_core_hour: float = DEFAULT_PRICE_PER_CORE_HOUR
    currency: str = DEFAULT_CURRENCY

    @classmethod
    def of(cls, settings: Any) -> Prices:
        """The prices a ``Settings`` holds."""
        return cls(settings.price_per_gib_hour, settings.price_per_core_hour, settings.price_currency)

    def per_day(self, memory_gib_hours: float | None, cpu_core_hours: float | None) -> float | None:
        """The money a day's GiB-hours and core-hours cost; None when neither is known (an unknown
        part counts as nothing, as the totals sum only what is known)."""
        if memory_gib_hours is None and cpu_core_hours is None:
            return None
        return (memory_gib_hours or 0.0) * self.per_gib_hour + (cpu_core_hours or 0.0) * self.per_core_hour

    def as_dict(self) -> dict[str, Any]:
        return {"per_gib_hour": self.per_gib_hour, "per_core_hour": self.per_core_hour, "currency": self.currency}


def money_block(prices: Prices, memory_gib_hours: float | None, cpu_core_hours: float | None) -> dict[str, Any]:
    """``{"per_day", "per_month", "currency"}`` of a saving (the wire's ``MoneyPublic``)."""
    day = prices.per_day(memory_gib_hours, cpu_core_hours)
    return {
        "per_day": None if day is None else round(day, 4),
        "per_month": None if day is None else round(day * MONTH_DAYS, 2),
        "currency": prices.currency,
    }
