"""A one-class score without a network: how far a cell's nucleus size is from the normal cells'.

Nuclear size is the oldest criterion of cytology: a blast, a promyelocyte or a monocyte has a
larger nucleus than a lymphocyte, and an erythroblast's is smaller. :class:`NucleusSize` keeps two
numbers of the training normals, the mean and the standard deviation of the log of the share of
a patch covered by its centre nucleus (:func:`cyto.data.scale.centre_nucleus_fraction`), and
scores a cell by how many standard deviations its own log share lies from that mean, on either
side. It needs cells at the training scale (``--zoom``): the share of a patch grows with the
square of the magnification.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cyto.data.scale import centre_nucleus_fraction
from cyto.errors import ConfigError

#: added to the share before its log, so a patch without a centre nucleus (share 0) scores far
#: out but finite
SHARE_FLOOR = 1e-3


def log_share(images: np.ndarray) -> np.ndarray:
    """(N,) log of each uint8 patch's centre-nucleus share (plus :data:`SHARE_FLOOR`)."""
    return np.log(centre_nucleus_fraction(images) + SHARE_FLOOR)


@dataclass(frozen=True)
class NucleusSize:
    """The nucleus-size score of cells against normal cells' mean and spread (see the module)."""

    mean: float
    sd: float

    @classmethod
    def fit(cls, normals: np.ndarray) -> NucleusSize:
        """The mean and standard deviation of ``normals``' log centre-nucleus shares."""
        if len(normals) < 2:
            raise ConfigError(f"a nucleus-size score needs >= 2 normal cells, got {len(normals)}")
        values = log_share(normals)
        sd = float(values.std())
        if not sd > 0:
            raise ConfigError(
                "the normal cells' nuclei all have the same size: no spread to score against "
                "(are the patches blank or identical?)"
            )
        return cls(float(values.mean()), sd)

    def score(self, images: np.ndarray) -> np.ndarray:
        """(N,) |log share - mean| / sd: higher is further from the normal cells' sizes."""
        return np.abs(log_share(images) - self.mean) / self.sd
