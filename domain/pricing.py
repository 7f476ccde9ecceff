"""The one pricing rule and the price table: what a model call's tokens cost, exactly (Decimal).

The LLM adapter prices each call with it (``adapters/llm``) and the projections reprice
recorded usage with it (``projections/cost_queries``, ``projections/repricing``); no other
module multiplies tokens by prices. Price keys are LiteLLM's. The rule (``cost_of``,
``ModelPrice``, ``TokenCounts``) lives in ``price_rule.py``; which price is in force for a model
name at a time (``PriceTable``: aliases, prefixes, effective dates) in ``price_table.py``.
Reading a price file is I/O and stays in the adapter (``load_price_table``).
"""

from __future__ import annotations

from flowledger.domain.price_rule import (
    EXACT,
    LONG_CONTEXT_TOKENS,
    TOKEN_FIELDS,
    ModelPrice,
    TokenCounts,
    cost_of,
    retried_cost_of,
)
from flowledger.domain.price_table import (
    DatedPrice,
    PriceTable,
    billed_key,
    model_names,
    price_table_from_document,
)

__all__ = [
    "EXACT",
    "LONG_CONTEXT_TOKENS",
    "TOKEN_FIELDS",
    "DatedPrice",
    "ModelPrice",
    "PriceTable",
    "TokenCounts",
    "billed_key",
    "cost_of",
    "model_names",
    "price_table_from_document",
    "retried_cost_of",
]
