"""Arrow types of the trace columns, so every Parquet file of a run has one schema
(an all-empty list column would otherwise be inferred as list<null>)."""
from __future__ import annotations

import pyarrow as pa

F = pa.float64()
I64 = pa.int64()
S = pa.string()
B = pa.bool_()
KNOWN = {
    # prompt rows
    "prompt_id": S, "turn": I64, "output_token_ids": pa.list_(I64), "output_text": S, "verifier_calls": I64,
    "new_tokens": I64,
    "acceptance_length": F, "wall_time_s": F, "mean_tree_size": F, "routing_choice": I64, "t_draft_s": F,
    "t_verify_s": F,
    "generate_tokens": I64, "generate_wall_time_s": F, "generate_matches": B,
    # step rows
    "step": I64, "tree_size": I64, "committed": I64, "accepted_depth": I64, "chosen_drafter": I64,
    "accepted_owner": I64,
    "accepted_owner_mask": I64, "drafter_mean_confidence": pa.list_(F), "drafter_mean_entropy": pa.list_(F),
    "drafter_mean_node_confidence": pa.list_(F), "accepted_draft_confidence": pa.list_(F),
    "rejected_draft_confidence": F, "accepted_path_confidence": pa.list_(F), "offpath_confidence_sum": F,
    "offpath_nodes": I64,
    "accepted_draft_entropy": pa.list_(F), "accepted_verifier_entropy": pa.list_(F),
    "rejected_draft_entropy": F,
    "rejected_verifier_entropy": F, "depth_accept": pa.list_(B), "t_bookkeeping_s": F,
    "drafter_agreement": pa.list_(F), "t_feedback_s": F,
    # cell columns
    "backbone": S, "benchmark": S, "temperature": F, "drafter": S, "strategy": S, "routing_granularity": S,
    "merge_dedup": B, "total_tokens": I64, "budget_matched": B, "cell_key": S, "unit_key": S, "tree": S,
    "tree_shape": S,
}


def to_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return pa.table({})
    names = list(rows[0])
    fields = [pa.field(n, KNOWN[n]) if n in KNOWN else None for n in names]
    if all(fields):
        return pa.Table.from_pylist(rows, schema=pa.schema(fields))
    table = pa.Table.from_pylist(rows)
    return table.cast(pa.schema([pa.field(n, KNOWN.get(n, table.schema.field(n).type))
                                 for n in table.column_names]))
