"""A learned size ruler (one-class, in the manner of GEOM, Golan & El-Yaniv 2018): a small CNN
taught on normal crops only to tell by how much a crop was zoomed (log factor, regression).
A lesion's enlarged nucleus reads as a zoomed-in normal cell: the anomaly score is the zoom the
network reads off the crop as it is (larger = more abnormal). Every input is downsampled
(antialiased) to the same grid, so sharpness is no clue to the zoom."""

import argparse
import json
import time

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from load import load
from nucmask import centre_nucleus_mask
from sklearn.metrics import roc_auc_score
from split import dev_folds
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--fold", type=int, default=0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--field", type=int, default=64, help="source px seen at zoom 1")
ap.add_argument("--out", type=int, default=32, help="network input px")
ap.add_argument("--zmin", type=float, default=0.67)
ap.add_argument("--zmax", type=float, default=1.5)
ap.add_argument("--epochs", type=int, default=30)
ap.add_argument("--width", type=int, default=32)
ap.add_argument("--gray", type=int, default=0)
ap.add_argument("--recentre", type=int, default=1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--test-zooms", default="1", help="zooms read at test, their residuals averaged")
ap.add_argument("--ema", type=float, default=0.0, help="score with an exponential average of the weights")
ap.add_argument("--knn", type=int, default=0, help="also rank by the mean distance to the k nearest training normals in the ruler's features")
ap.add_argument("--tag", default="")
a = ap.parse_args()
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)
torch.set_num_threads(a.threads)
X, Y, I = load()
y = (Y != "NILM").astype(int)


def recentre(x):
    m = centre_nucleus_mask(x)
    if m is None:
        return x
    ys, xs = np.nonzero(m)
    dy, dx = 50 - ys.mean(), 50 - xs.mean()
    return cv2.warpAffine(x, np.float32([[1, 0, dx], [0, 1, dy]]), (100, 100), borderMode=cv2.BORDER_REFLECT)


if a.recentre:
    X = np.stack([recentre(x) for x in X])
tr, te = dev_folds(Y, I)[a.fold]


def view(x, z, shift=(0.0, 0.0), k=0, flip=False):
    """the central field/z source px about the centre (+shift), resampled to out px"""
    src = a.field / z
    s = a.out / src  # < 1 always: a downsample
    cx, cy = 50 + shift[0], 50 + shift[1]
    M = np.float32([[s, 0, a.out / 2 - s * cx], [0, s, a.out / 2 - s * cy]])
    # antialias: blur the source by the downsample's scale first
    sigma = max(0.0, 0.5 * (1 / s - 1))
    xb = cv2.GaussianBlur(x, (0, 0), sigma) if sigma > 0.1 else x
    v = cv2.warpAffine(xb, M, (a.out, a.out), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    v = np.rot90(v, k)
    if flip:
        v = v[:, ::-1]
    return np.ascontiguousarray(v)


def to_t(b):
    t = torch.from_numpy(np.stack(b)).permute(0, 3, 1, 2).float() / 255.0
    if a.gray:
        t = t.mean(1, keepdim=True)
    return (t - 0.5) / 0.25


class Net(nn.Module):
    def __init__(s, w=32, cin=3):
        super().__init__()
        L = []
        c = cin
        for o in (w, 2 * w, 4 * w):
            L += [
                nn.Conv2d(c, o, 3, padding=1),
                nn.BatchNorm2d(o),
                nn.ReLU(),
                nn.Conv2d(o, o, 3, padding=1),
                nn.BatchNorm2d(o),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            c = o
        s.f = nn.Sequential(*L)
        s.h = nn.Linear(c, 1)

    def forward(s, x):
        return s.h(s.f(x).mean((2, 3))).squeeze(1)


net = Net(a.width, 1 if a.gray else 3)
live = net
if a.ema:
    import copy

    net = copy.deepcopy(live)  # what scores(): the average; live is trained
Xtr = X[tr]
bs = 64
steps = a.epochs * ((len(Xtr) + bs - 1) // bs)
opt = torch.optim.AdamW(live.parameters(), 1e-3, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=steps)
lo, hi = np.log(a.zmin), np.log(a.zmax)
# the largest source field must stay inside the crop: field/zmin <= 100
assert a.field / a.zmin <= 100.5, "field/zmin must fit the 100 px crop"


def scores(Xs):
    """the zoom read off each crop beyond the zoom applied, over the test zooms and the dihedral
    views: how much larger than a normal cell's its contents look (log)"""
    net.eval()
    out = []
    with torch.no_grad():
        for z in [float(t) for t in a.test_zooms.split(",")]:
            for k in range(4):
                for flip in (False, True):
                    vs = [view(x, z, k=k, flip=flip) for x in Xs]
                    read = torch.cat([net(to_t(vs[i : i + 256])) for i in range(0, len(vs), 256)]).numpy()
                    out.append(read - np.log(z))
    return np.mean(out, 0)


t0 = time.time()
for ep in range(a.epochs):
    live.train()
    perm = rng.permutation(len(Xtr))
    tot = 0
    for b in range(0, len(perm), bs):
        ids = perm[b : b + bs]
        lz = rng.uniform(lo, hi, len(ids))
        vs = [
            view(Xtr[i], float(np.exp(l)), shift=tuple(rng.uniform(-3, 3, 2)), k=int(rng.integers(4)), flip=bool(rng.random() < 0.5))
            for i, l in zip(ids, lz)
        ]
        loss = F.mse_loss(live(to_t(vs)), torch.from_numpy(lz).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if a.ema:
            with torch.no_grad():
                for pa, pl in zip(net.state_dict().values(), live.state_dict().values()):
                    if pa.dtype.is_floating_point:
                        pa.mul_(a.ema).add_(pl, alpha=1 - a.ema)
                    else:
                        pa.copy_(pl)
        tot += loss.item() * len(ids)
    if ep % 5 == 4 or ep == a.epochs - 1:
        s = scores(X[te])
        print(ep, round(tot / len(Xtr), 4), "AUROC", round(roc_auc_score(y[te], s), 3), f"{time.time() - t0:.0f}s", flush=True)
if a.knn:
    def feats(Xs, z):
        net.eval()
        with torch.no_grad():
            vs = [view(x, z) for x in Xs]
            f = torch.cat([net.f(to_t(vs[i : i + 256])).mean((2, 3)) for i in range(0, len(vs), 256)])
        return F.normalize(f, dim=1).numpy()

    for z in [float(t) for t in a.test_zooms.split(",")][:1] + [1.0]:
        ftr, fte = feats(Xtr, z), feats(X[te], z)
        d = np.sort(2 - 2 * fte @ ftr.T, axis=1)[:, : a.knn].mean(1)
        print("knn", a.knn, "zoom", z, "AUROC", round(roc_auc_score(y[te], d), 3), flush=True)
np.save(f"scores_zoom{a.tag}_f{a.fold}_s{a.seed}.npy", s)
r = dict(fold=a.fold, seed=a.seed, auroc=roc_auc_score(y[te], s))
for c in ["ASC-US", "LSIL", "ASC-H"]:
    mm = (Y[te] == "NILM") | (Y[te] == c)
    r[c] = roc_auc_score(y[te][mm], s[mm])
print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}), vars(a))
