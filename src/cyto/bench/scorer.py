"""``cyto bench scorer``: the numba scoring kernels against sklearn and a plain numpy reference.

- OC-SVM (DROC): queries/s of ``ocsvm_scores`` (BLAS GEMM + numba RBF), sklearn's
  ``OneClassSVM.decision_function`` and the numpy broadcast reference, over query count and
  number of support vectors, with the largest difference from sklearn.
- Deep SVDD: ``dsvdd_scores`` (seeds x TTA views, blend, ensemble mean) against its numpy
  reference.

sklearn and the numpy reference are slow on large inputs: they are timed on at most
``max_slow_queries`` queries (the numpy reference on as many as fit in ~400 MB) and their rate is
per query (they scale linearly in it).
"""

from __future__ import annotations

import numpy as np

from cyto.bench.engine import time_calls

OCSVM_COLUMNS = [
    ("queries", "queries"),
    ("support_vectors", "SVs"),
    ("numba_per_s", "numba /s"),
    ("sklearn_per_s", "sklearn /s"),
    ("numpy_ref_per_s", "numpy /s"),
    ("numba_vs_sklearn", "numba vs sklearn"),
]


def _rate(n: int, times: list[float]) -> float:
    return round(n / float(np.median(times)), 1)


def _ocsvm_row(svm, q: np.ndarray, repeats: int, budget: float, max_slow: int) -> dict:
    from cyto.runtime.heads import ocsvm

    sv, coef = svm.support_vectors_, svm.dual_coef_.ravel()
    gamma, rho = float(svm._gamma), float(-svm.intercept_[0])
    n, dims = q.shape
    slow = q[: min(n, max_slow)]

    def numba_call():
        return ocsvm.ocsvm_scores(q, sv, coef, gamma, rho)

    t_nb = time_calls(numba_call, lambda: None, 1, repeats, budget)
    t_sk = time_calls(lambda: svm.decision_function(slow), lambda: None, 0, 1, 0)
    # the reference broadcasts (queries, SVs, dims) in float64: keep that under ~400 MB
    ref_q = slow[: max(1, min(len(slow), int(5e7 // (len(sv) * dims))))]
    t_ref = time_calls(
        lambda: ocsvm.ocsvm_scores_ref(ref_q, sv, coef, gamma, rho), lambda: None, 0, 1, 0
    )
    check = slow[:2000]
    diff = float(
        np.abs(ocsvm.ocsvm_scores(check, sv, coef, gamma, rho) + svm.decision_function(check)).max()
    )
    row = {
        "scorer": "ocsvm",
        "queries": n,
        "support_vectors": len(sv),
        "dims": dims,
        "numba_per_s": _rate(n, t_nb),
        "sklearn_per_s": _rate(len(slow), t_sk),
        "numpy_ref_per_s": _rate(len(ref_q), t_ref),
        "max_abs_diff_vs_sklearn": diff,
    }
    row["numba_vs_sklearn"] = round(row["numba_per_s"] / row["sklearn_per_s"], 2)
    row["numba_vs_numpy_ref"] = round(row["numba_per_s"] / row["numpy_ref_per_s"], 2)
    return row


def bench_scorer(
    queries: list[int],
    support_vectors: list[int],
    dims: int = 512,
    repeats: int = 3,
    budget: float = 3.0,
    max_slow_queries: int = 20_000,
    seed: int = 0,
    echo=print,
) -> list[dict]:
    from sklearn.svm import OneClassSVM

    from cyto.runtime.heads import dsvdd

    rng = np.random.default_rng(seed)
    rows = []
    for n_sv in support_vectors:
        nu = 0.5
        train = rng.normal(size=(int(n_sv / nu), dims)) / np.sqrt(dims)
        svm = OneClassSVM(kernel="rbf", nu=nu, gamma="auto").fit(train)
        for n in queries:
            q = rng.normal(size=(n, dims)) / np.sqrt(dims)
            row = _ocsvm_row(svm, q, repeats, budget, max_slow_queries)
            rows.append(row)
            echo(
                f"ocsvm {n:>7d} queries x {len(svm.support_vectors_):>5d} SVs: numba "
                f"{row['numba_per_s']:>10,.0f}/s  sklearn {row['sklearn_per_s']:>9,.0f}/s  "
                f"numpy {row['numpy_ref_per_s']:>9,.0f}/s  ({row['numba_vs_sklearn']}x sklearn)"
            )
    seeds, views = 5, 4
    centres = rng.normal(size=(seeds, dims)).astype(np.float32)
    # (seeds, views, n, dims) float32 embeddings: 10,000 queries (400 MB) at most
    for n in sorted({min(q, 10_000) for q in queries}):
        emb = rng.normal(size=(seeds, views, n, dims)).astype(np.float32)
        t_nb = time_calls(
            lambda e=emb: dsvdd.dsvdd_scores(e, centres, 0.35), lambda: None, 1, repeats, budget
        )
        t_ref = time_calls(
            lambda e=emb: dsvdd.dsvdd_scores_ref(e, centres, 0.35),
            lambda: None,
            0,
            repeats,
            budget,
        )
        row = {
            "scorer": "dsvdd",
            "queries": n,
            "seeds": seeds,
            "views": views,
            "dims": dims,
            "numba_per_s": _rate(n, t_nb),
            "numpy_ref_per_s": _rate(n, t_ref),
            "max_abs_diff_vs_ref": float(
                np.abs(
                    dsvdd.dsvdd_scores(emb, centres, 0.35)
                    - dsvdd.dsvdd_scores_ref(emb, centres, 0.35)
                ).max()
            ),
        }
        row["numba_vs_numpy_ref"] = round(row["numba_per_s"] / row["numpy_ref_per_s"], 2)
        rows.append(row)
        echo(
            f"dsvdd {n:>7d} queries ({seeds} seeds x {views} views): numba "
            f"{row['numba_per_s']:>10,.0f}/s  numpy {row['numpy_ref_per_s']:>10,.0f}/s"
        )
    return rows
