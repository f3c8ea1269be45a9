"""The nucleus detector of :mod:`cyto.detect`, written in torch so that it runs where the
engine runs (CPU or CUDA), on a tile already in that device's memory.

Every step is the SciPy/scikit-image detector's, as tensor operations:

* haematoxylin through the same 256-entry tables; Gaussian smoothing with SciPy's kernel (radius
  ``int(4 sigma + 0.5)``, half-sample reflection at the borders);
* Otsu's threshold on a 256-bin histogram between the tile's minimum and maximum, as
  ``skimage.filters.threshold_otsu``, with the same floor; a tile with opaque pixels (ink,
  black fill) measures it on the host without them and their blur, by the SciPy detector's rule;
* binary opening with the 4-neighbour cross (erosion, then dilation; outside the tile is
  background), as ``ndimage.binary_opening``;
* connected components (4-neighbour) by label propagation with pointer jumping: each round takes
  the smallest label among a pixel and its neighbours, then follows labels to their own label;
* the exact Euclidean distance to the nearest background pixel by two passes of a min-plus
  filter (first down the columns, then along the rows) over a window as wide as the largest
  nucleus allowed; only background inside the tile counts, as in ``distance_transform_edt``;
* peaks: the window maximum is a max-pool on the device; the rest is the SciPy detector's own
  ``component_peaks`` on the host, so the peaks are ``peak_local_max``'s exactly;
* one peak per large nucleus and the area range: the same rule on the (few) peaks, on the host.

Results are ``(N, 3)`` arrays of x, y, area in tile pixels, like ``detect_nuclei``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from cyto.detect.params import (
    _H_FROM_RGB,
    _HED_LOG,
    OPAQUE_RGB,
    NucleusParams,
    check_tile,
    clear_of_opaque,
    floor_of,
    from_reduced,
    lowest_floor,
    nuclei_from_peaks,
    off_ink,
    opaque_reach,
    own_threshold,
    reduced_params,
    subtract_background,
)
from cyto.detect.peaks import component_peaks

_BIG = torch.iinfo(torch.int64).max


def _luts(device: torch.device, channel: str = "haematoxylin") -> torch.Tensor:
    weights = _H_FROM_RGB if channel == "haematoxylin" else (1.0, 1.0, 1.0)
    return torch.stack([torch.from_numpy((_HED_LOG * w).astype(np.float32)) for w in weights]).to(
        device
    )


def haematoxylin(rgb: torch.Tensor, channel: str = "haematoxylin") -> torch.Tensor:
    """(H, W) float32 nuclear signal of an (H, W, 3) uint8 tensor (the SciPy detector's
    tables: the haematoxylin column, or the optical density summed, ``od``)."""
    lut = _luts(rgb.device, channel)
    idx = rgb.long()
    h = lut[0][idx[..., 0]] + lut[1][idx[..., 1]] + lut[2][idx[..., 2]]
    return h.clamp_(min=0.0)


def _reflect_pad(x: torch.Tensor, r: int, dim: int) -> torch.Tensor:
    """SciPy's ``reflect`` mode (d c b a | a b c d: the edge sample repeated), any width."""
    n = x.shape[dim]
    i = torch.arange(-r, n + r, device=x.device) % (2 * n)
    return x.index_select(dim, torch.where(i < n, i, 2 * n - 1 - i))


def gaussian(img: torch.Tensor, sigma: float) -> torch.Tensor:
    """``scipy.ndimage.gaussian_filter(img, sigma)`` (truncate 4, mode reflect) for (H, W)."""
    r = int(4.0 * sigma + 0.5)
    if r < 1:
        return img
    x = torch.arange(-r, r + 1, device=img.device, dtype=torch.float64)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    k = (k / k.sum()).to(img.dtype)
    out = _reflect_pad(img, r, 0)  # rows
    out = F.conv1d(out.T.unsqueeze(1), k.view(1, 1, -1)).squeeze(1).T
    out = _reflect_pad(out, r, 1)  # columns
    return F.conv1d(out.unsqueeze(1), k.view(1, 1, -1)).squeeze(1)


def otsu(img: torch.Tensor, nbins: int = 256) -> float:
    """``skimage.filters.threshold_otsu(img)`` (a 256-bin histogram over the image's range)."""
    lo, hi = float(img.min()), float(img.max())
    if hi <= lo:
        raise ValueError("a constant image has no Otsu threshold")
    x = img.double()
    hist = torch.histc(x, bins=nbins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, nbins + 1, dtype=torch.float64, device=img.device)
    centers = (edges[:-1] + edges[1:]) / 2
    w1 = torch.cumsum(hist, 0)
    w2 = torch.cumsum(hist.flip(0), 0).flip(0)
    m1 = torch.cumsum(hist * centers, 0) / w1.clamp(min=1e-12)
    m2 = (torch.cumsum((hist * centers).flip(0), 0) / w2.flip(0).clamp(min=1e-12)).flip(0)
    var = w1[:-1] * w2[1:] * (m1[:-1] - m2[1:]) ** 2
    return float(centers[int(torch.argmax(var))])


def _cross_neighbours(x: torch.Tensor, fill) -> list[torch.Tensor]:
    """The 4 neighbours of every pixel of an (H, W) tensor; ``fill`` outside the tile."""
    h, w = x.shape
    padded = torch.full((h + 2, w + 2), fill, dtype=x.dtype, device=x.device)
    padded[1:-1, 1:-1] = x
    return [padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]]


def binary_opening(mask: torch.Tensor) -> torch.Tensor:
    """``ndimage.binary_opening(mask, iterations=1)`` with the cross (outside is background)."""
    eroded = mask.clone()
    for n in _cross_neighbours(mask, False):
        eroded &= n
    out = eroded.clone()
    for n in _cross_neighbours(eroded, False):
        out |= n
    return out


def label(mask: torch.Tensor) -> torch.Tensor:
    """4-neighbour connected components: (H, W) int64, 0 = background, components numbered
    1..n in raster order of their first pixel (as ``ndimage.label``).

    Works on the foreground pixels only: each holds the index of a pixel of its component;
    rounds take the smallest index among a pixel and its 4 neighbours, then jump to that pixel's
    own index (pointer jumping), until nothing changes."""
    h, w = mask.shape
    flat = mask.reshape(-1)
    pos = torch.nonzero(flat).squeeze(1)  # raster order
    n = len(pos)
    out = torch.zeros(h * w, dtype=torch.int64, device=mask.device)
    if n == 0:
        return out.view(h, w)
    compact = torch.full((h * w,), -1, dtype=torch.int64, device=mask.device)
    compact[pos] = torch.arange(n, device=mask.device)
    r, c = pos // w, pos % w
    own = torch.arange(n, device=mask.device)
    neighbours = []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        rr, cc = r + dr, c + dc
        ok = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
        j = torch.where(ok, compact[(rr.clamp(0, h - 1)) * w + cc.clamp(0, w - 1)], -1)
        neighbours.append(torch.where(j >= 0, j, own))  # background or outside: itself
    lab = own.clone()
    while True:
        nxt = lab
        for j in neighbours:
            nxt = torch.minimum(nxt, lab[j])
        for _ in range(3):
            nxt = nxt[nxt]
        if torch.equal(nxt, lab):
            break
        lab = nxt
    _, number = torch.unique(lab, return_inverse=True)  # roots are raster-first pixels
    out[pos] = number + 1
    return out.view(h, w)


def distance_transform(mask: torch.Tensor, radius: int) -> torch.Tensor:
    """Euclidean distance of each foreground pixel to the nearest background pixel inside the
    tile, exact up to ``radius`` (deeper pixels get at most about ``radius``)."""
    h, w = mask.shape
    inf = float((2 * radius + 2) ** 2)
    bg = ~mask
    # down the columns: squared distance to the nearest background pixel in the same column
    g = torch.where(bg, 0.0, inf).to(torch.float32)  # + d^2 stays inf off the background
    col = g.clone()
    for dy in range(1, min(radius, h - 1) + 1):
        d2 = float(dy * dy)
        torch.minimum(col[dy:], g[:-dy] + d2, out=col[dy:])
        torch.minimum(col[:-dy], g[dy:] + d2, out=col[:-dy])
    # along the rows: min over dx of dx^2 + column distance
    out = col.clone()
    for dx in range(1, min(radius, w - 1) + 1):
        d2 = float(dx * dx)
        torch.minimum(out[:, dx:], col[:, :-dx] + d2, out=out[:, dx:])
        torch.minimum(out[:, :-dx], col[:, dx:] + d2, out=out[:, :-dx])
    return torch.sqrt(out.clamp(max=inf)) * mask


def _window_max(dist: torch.Tensor, min_distance: int) -> torch.Tensor:
    """The maximum of ``dist`` over each ``2 min_distance + 1`` square (a max-pool in two
    passes), as ``ndimage.maximum_filter``."""
    size = 2 * min_distance + 1
    pooled = F.max_pool2d(dist[None, None], (1, size), stride=1, padding=(0, min_distance))
    return F.max_pool2d(pooled, (size, 1), stride=1, padding=(min_distance, 0))[0, 0]


def detect_nuclei_torch(
    rgb: np.ndarray | torch.Tensor, params: NucleusParams = NucleusParams(), device=None
) -> np.ndarray:
    """Nucleus centres in one RGB tile on ``device`` (default: the tensor's, else CPU): (N, 3)
    float array of x, y, area in tile pixels, like :func:`cyto.detect.detect_nuclei`."""
    check_tile(rgb)
    t = rgb if isinstance(rgb, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rgb))
    if device is not None:
        t = t.to(device)
    k = params.reduction()
    if k > 1:
        return from_reduced(_detect(reduce_like_pil(t, k), reduced_params(params, k)), k)
    return _detect(t, params)


def reduce_like_pil(t: torch.Tensor, k: int) -> torch.Tensor:
    """PIL's ``Image.reduce(k)`` of an (H, W, 3) uint8 tensor: each k x k block (a partial one at
    the right or bottom edge over the pixels it holds) is its sum plus half its size,
    integer-divided by its size (round half up)."""
    x = t.permute(2, 0, 1).double()[None]
    sums = F.avg_pool2d(x, k, ceil_mode=True, divisor_override=1)[0]
    ones = torch.ones((1, 1, *t.shape[:2]), dtype=torch.float64, device=t.device)
    n = F.avg_pool2d(ones, k, ceil_mode=True, divisor_override=1)[0]
    small = torch.floor((sums + torch.floor(n / 2)) / n)
    return small.clamp(0, 255).to(torch.uint8).permute(1, 2, 0)


def _any_opaque(rgb: torch.Tensor) -> bool:
    """Whether ``rgb`` has a pixel no light passed (:data:`OPAQUE_RGB`), asked on its device."""
    return bool((rgb[..., :3].amax(dim=-1) < OPAQUE_RGB).any())


def _detect(rgb: torch.Tensor, params: NucleusParams) -> np.ndarray:
    empty = np.empty((0, 3), dtype=np.float64)
    h = gaussian(haematoxylin(rgb, params.channel), params.sigma)
    if params.background > 0:  # the SciPy detector's top-hat, on the host
        h = torch.from_numpy(subtract_background(h.cpu().numpy(), params.background)).to(h.device)
    if float(h.max()) < lowest_floor(params):
        return empty
    if params.threshold is not None:  # the slide's, the same for every tile
        t = max(params.threshold, lowest_floor(params))
    else:
        try:
            if _any_opaque(rgb):  # ink: left out on the host, by the SciPy detector's rule
                reach = opaque_reach(rgb.cpu().numpy(), params.sigma)
                t = own_threshold(clear_of_opaque(h.cpu().numpy(), reach), params)
            elif params.classes == 3:  # the three-class cut on the host, as the SciPy detector
                t = own_threshold(h.cpu().numpy(), params)
            else:
                t = max(otsu(h), floor_of(h, params))
        except ValueError:  # a constant tile, or all ink
            return empty
    mask = binary_opening(h > t)
    if not bool(mask.any()):
        return empty
    labels = label(mask)
    n = int(labels.max())
    areas = torch.bincount(labels.view(-1), minlength=n + 1)[1:].cpu().numpy()
    radius = int(np.ceil(np.sqrt(params.max_area / np.pi))) + 2
    dist = distance_transform(mask, radius)
    pooled = _window_max(dist, params.min_distance).cpu().numpy()
    dist_np, labels_np = dist.cpu().numpy(), labels.cpu().numpy()
    peaks = component_peaks(dist_np, labels_np, params.min_distance, window_max=pooled, sizes=areas)
    if len(peaks) == 0:
        return empty
    found = nuclei_from_peaks(peaks, dist_np, labels_np, areas, params)
    at = torch.from_numpy(found[:, 1::-1].astype(np.int64)).to(rgb.device)  # (row, col) each
    return off_ink(found, rgb[at[:, 0], at[:, 1]].cpu().numpy())
