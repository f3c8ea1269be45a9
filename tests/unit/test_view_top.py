"""The viewer's list of top cells shows the value their rank follows (issue 68, class 7): cells
ranked by the fused or the morphometric score listed with the model's score read as out of
order (3.48, 2.96, 2.19, 2.00, 2.33 ...)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cyto.data.morphometry import ranked_values
from cyto.infer.outputs import ranks
from cyto.view.folder import top_cells


def _table(how: str, n: int = 40, seed: int = 0) -> pa.Table:
    """A score table as cyto score writes one, ranked ``how``, in rank order."""
    rng = np.random.default_rng(seed)
    score, morph = rng.normal(size=n), rng.normal(size=n)
    ranked = ranked_values(how, score, morph)
    order, rank = ranks(ranked, then=score)
    cols = {
        "cell_id": np.arange(n),
        "x": rng.uniform(0, 100, n),
        "y": rng.uniform(0, 100, n),
        "score": score,
        "morphometry_score": morph,
        "rank": rank,
    }
    if how == "model+morphometry":
        cols["fused_score"] = ranked
    t = pa.table(cols).replace_schema_metadata({"cyto.rank_by": how})
    return t.take(np.argsort(rank, kind="stable"))


@pytest.mark.parametrize(
    ("how", "column", "label"),
    [
        ("model", "score", "score"),
        ("morphometry", "morphometry_score", "morphometric score"),
        ("model+morphometry", "fused_score", "fused score"),
    ],
)
def test_the_top_list_shows_what_the_rank_follows(how, column, label):
    t = _table(how)
    by, top = top_cells(t, 10, None, rank_by="model")  # the table's metadata decides
    assert by == {"rank_by": how, "column": column, "label": label}
    values = [c["rank_value"] for c in top]
    assert values == sorted(values, reverse=True)  # in rank order, no jumps back up
    assert values == t[column].to_pylist()[:10]
    assert [c["score"] for c in top] == t["score"].to_pylist()[:10]  # the model's, beside it


def test_a_table_without_its_ranking_recorded_follows_the_summary():
    t = _table("morphometry").replace_schema_metadata({})
    by, _ = top_cells(t, 5, None, rank_by="morphometry")
    assert by["column"] == "morphometry_score"


def test_the_page_lists_the_rank_value_with_its_label():
    js = (Path(__file__).parents[2] / "src/cyto/view/static/view.js").read_text()
    assert "${by.label} ${num(c.rank_value)}" in js
