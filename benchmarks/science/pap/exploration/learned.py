import numpy as np, sys, time, json, argparse, torch
from sklearn.metrics import roc_auc_score
from PIL import Image
from load import *; from split import dev_folds
from cyto.train.config import resolve_config
from cyto.train.registry import get_method
from cyto.train.data import TrainData
ap=argparse.ArgumentParser(); ap.add_argument('--method',default='dsvdd'); ap.add_argument('--preset',default='fast')
ap.add_argument('--set',nargs='*',default=[]); ap.add_argument('--seeds',default='0'); ap.add_argument('--folds',default='0,1')
ap.add_argument('--load',type=int,default=80); ap.add_argument('--zoom',type=float,default=1.0); ap.add_argument('--tag',default=''); ap.add_argument('--recentre',type=int,default=0); ap.add_argument('--gray',type=int,default=0); ap.add_argument('--knn',type=int,default=0)
a=ap.parse_args()
torch.set_num_threads(2)
X,Y,I=load()
y=(Y!='NILM').astype(int)
import cv2
from nucmask import centre_nucleus_mask
def recentre(x):
    m=centre_nucleus_mask(x)
    if m is None: return x
    ys,xs=np.nonzero(m); dy,dx=50-ys.mean(),50-xs.mean()
    return cv2.warpAffine(x,np.float32([[1,0,dx],[0,1,dy]]),(100,100),borderMode=cv2.BORDER_REFLECT)
def prep(X):
    out=[]
    for x in X:
        if a.recentre: x=recentre(x)
        if a.gray: x=np.repeat(x.mean(-1,keepdims=True).astype(np.uint8),3,-1)
        if a.zoom!=1.0:
            side=round(100/a.zoom); o=(100-side)//2; x=x[o:o+side,o:o+side]
        out.append(np.asarray(Image.fromarray(x).resize((a.load,a.load),Image.BILINEAR)))
    return np.stack(out)
Xp=prep(X)
def rwr1(ys, s, draws=300, seed=0):
    rng=np.random.default_rng(seed); nn=s[ys==0]; aa=s[ys==1]; na=max(1,round(0.01*len(nn)/0.99)); k=int(np.ceil(0.05*(len(nn)+na)))
    r=[]
    for _ in range(draws):
        pool=np.r_[nn, rng.choice(aa,na,replace=False)]; lab=np.r_[np.zeros(len(nn)),np.ones(na)]
        o=np.argsort(-pool,kind='stable'); r.append(lab[o[:k]].sum()/na)
    return np.mean(r)
ov=dict(kv.split('=',1) for kv in a.set)
folds=dev_folds(Y,I)
res=[]
for f in map(int,a.folds.split(',')):
    tr,te=folds[f]
    for seed in map(int,a.seeds.split(',')):
        cls=get_method(a.method); cfg=resolve_config(cls.Config,a.preset,overrides={**ov,'seed':seed})
        t=time.time(); m=cls(cfg).fit(TrainData(Xp[tr],np.zeros(len(tr),np.int8)),device='cpu'); ft=time.time()-t
        s=m.score(Xp[te])
        if a.knn:
            from sklearn.neighbors import NearestNeighbors
            e_tr=m.embed(Xp[tr]); e_te=m.embed(Xp[te]); mu=e_tr.mean(0); sd=e_tr.std(0)+1e-6
            nn=NearestNeighbors(n_neighbors=a.knn).fit((e_tr-mu)/sd); s=nn.kneighbors((e_te-mu)/sd)[0].mean(1)

        r=dict(fold=f,seed=seed,auroc=roc_auc_score(y[te],s),rwr1=rwr1(y[te],s),fit_s=ft)
        for c in ['ASC-US','LSIL']:
            mm=(Y[te]=='NILM')|(Y[te]==c); r[c]=roc_auc_score(y[te][mm],s[mm])
        print(a.tag, json.dumps({k:(round(v,3) if isinstance(v,float) else v) for k,v in r.items()}),flush=True); res.append(r)
        np.save(f'scores_{a.tag or a.method}_f{f}_s{seed}.npy', s)
A=np.array([r['auroc'] for r in res]); print(a.tag, a.method, a.set, 'AUROC mean', A.mean().round(3), 'sd', A.std().round(3))
