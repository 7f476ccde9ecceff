"""The price table a server's reports price with: the one its calls are priced with."""

from __future__ import annotations

import threading
from weakref import WeakKeyDictionary

from flowledger.adapters.llm.pricing import PriceTable, load_price_table
from flowledger.infrastructure import Engine

_READ: WeakKeyDictionary[Engine, PriceTable] = WeakKeyDictionary()
"""The configured file's table, read once per engine without an LLM adapter."""
_READING = threading.Lock()


def served_prices(engine: Engine) -> PriceTable:
    """The table the engine's LLM adapter prices its calls with, read once when it was built;
    without such an adapter (calls recorded elsewhere), the configured file, read once, at the
    first report that needs it (a file that cannot be read is not kept: the next one reads again).

    Read again at every request, a price file edited while the server ran repriced its calls in
    the tier what-if and ``reprice_as`` at prices it did not charge (gpt-4.1 raised tenfold: its
    own calls "cost" $0.0252 more at gpt-4.1), and a file broken meanwhile made them, and the
    whole ``/dashboard`` page, a 422 while every call was still priced by the table read."""
    prices = getattr(engine.llm, "prices", None)
    if isinstance(prices, PriceTable):
        return prices
    with _READING:
        read = _READ.get(engine)
        if read is None:
            read = _READ[engine] = load_price_table(engine.settings.pricing_file)
        return read
