"""The scorer-head contract: what turns a graph's output into one score per cell.

A head holds the arrays it needs (from the bundle's ``scorer.npz``) and its parameters, and
computes the final score three ways that must agree: ``finish`` (numba, float64, what every
backend ends in), ``reference`` (plain numpy, for tests) and ``torch_finish`` (on any torch
device, what training evaluates and what a GPU pipeline may run next to the network). Higher is
always more abnormal.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from cyto.errors import BundleError


class Head(ABC):
    """Base of the scorer heads. Subclasses set the class attributes and the three finishes."""

    #: the manifest's ``scorer_kind``
    name: ClassVar[str] = ""
    #: the exported graph's output tensor
    output: ClassVar[str] = ""
    #: the axis of the graph output that indexes cells
    batch_axis: ClassVar[int] = 0
    #: the arrays the head needs from ``scorer.npz``
    arrays: ClassVar[tuple[str, ...]] = ()
    #: what the graph computes, and what the head does with it
    graph_output: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def from_bundle(cls, spec: Any, arrays: dict[str, np.ndarray]) -> Head:
        """Build the head from a :class:`~cyto.bundle.ModelSpec` and the scorer arrays."""

    @classmethod
    def require(cls, arrays: dict[str, np.ndarray], where: object = "bundle") -> None:
        missing = [k for k in cls.arrays if k not in arrays]
        if missing:
            raise BundleError(
                f"{where}: a {cls.name} model needs the scorer arrays {', '.join(missing)} in "
                "scorer.npz, which the bundle lacks (incomplete bundle)"
            )

    @abstractmethod
    def finish(self, out: np.ndarray) -> np.ndarray:
        """Graph output (one batch) -> (N,) float64 scores."""

    @abstractmethod
    def reference(self, out: np.ndarray) -> np.ndarray:
        """The same as :meth:`finish` in plain numpy."""

    @abstractmethod
    def torch_finish(self, out):
        """The same as :meth:`finish` on a torch tensor, on its device."""

    def describe(self) -> str:
        return f"{self.name}: graph -> {self.graph_output}; head: {self.summary}"

    def n_cells(self, out: np.ndarray) -> int:
        return int(out.shape[self.batch_axis])

    def _tensor(self, key: str, like):
        """The array ``key`` as a float64 tensor on ``like``'s device (cached per device)."""
        import torch

        cache = self.__dict__.setdefault("_tensors", {})
        k = (key, str(like.device))
        if k not in cache:
            cache[k] = torch.as_tensor(
                np.asarray(getattr(self, key)), dtype=torch.float64, device=like.device
            )
        return cache[k]
