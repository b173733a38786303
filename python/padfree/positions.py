"""How Hugging Face encoders number token positions: the one rule behind the longest sequence a
model serves, read by the engine builder (from export metadata) and the runtime (from a config)."""
from __future__ import annotations

# RoBERTa and its derivatives number a sequence's positions from pad_token_id + 1.
OFFSET_POSITION_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert")


def positions_served(table_rows: int, model_type: str, pad_token_id) -> int:
    """Longest sequence a position table of table_rows rows serves for this model type.
    pad_token_id is read only for the offset types (other configs may leave it None)."""
    if model_type in OFFSET_POSITION_MODEL_TYPES:
        return table_rows - (int(pad_token_id) + 1)
    return table_rows
