import numpy as np, torch, time, argparse, json, cv2
from torch import nn
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from load import *; from split import dev_folds; from nucmask import *
ap=argparse.ArgumentParser(); ap.add_argument('--fold',type=int,default=0); ap.add_argument('--seed',type=int,default=0)
ap.add_argument('--size',type=int,default=64); ap.add_argument('--epochs',type=int,default=15); ap.add_argument('--fmin',type=float,default=1.4); ap.add_argument('--fmax',type=float,default=2.0)
ap.add_argument('--dark',type=float,default=0.15); ap.add_argument('--bi',type=float,default=0.3); ap.add_argument('--width',type=int,default=32)
ap.add_argument('--gray',type=int,default=0); ap.add_argument('--match',type=int,default=0); ap.add_argument('--central',type=int,default=100); ap.add_argument('--recentre',type=int,default=0); ap.add_argument('--tag',default='')
a=ap.parse_args(); torch.manual_seed(a.seed); rng=np.random.default_rng(a.seed); torch.set_num_threads(2)
X,Y,I=load(); y=(Y!='NILM').astype(int)
def recentre(x):
    m=centre_nucleus_mask(x)
    if m is None: return x
    ys,xs=np.nonzero(m); dy,dx=50-ys.mean(),50-xs.mean()
    return cv2.warpAffine(x,np.float32([[1,0,dx],[0,1,dy]]),(100,100),borderMode=cv2.BORDER_REFLECT)
if a.recentre: X=np.stack([recentre(x) for x in X])
tr,te=dev_folds(Y,I)[a.fold]
masks=[centre_nucleus_mask(x) for x in X[tr]]
keep=[i for i,m in enumerate(masks) if m is not None and 20<m.sum()<2500]
print('train normals with a mask', len(keep), 'of', len(tr), flush=True)
def pseudo(x,m):
    f=rng.uniform(a.fmin,a.fmax); d=1+rng.uniform(-a.dark,a.dark)
    out=enlarge(x,m,f,d)
    if rng.random()<a.bi:  # a second nucleus beside
        ys,xs=np.nonzero(m); r=np.sqrt(m.sum()/np.pi)*f; ang=rng.uniform(0,2*np.pi)
        dy,dx=np.sin(ang)*2*r,np.cos(ang)*2*r
        M=np.float32([[f,0,xs.mean()*(1-f)+dx],[0,f,ys.mean()*(1-f)+dy]])
        big=cv2.warpAffine(x,M,(100,100),borderMode=cv2.BORDER_REFLECT); bm=cv2.GaussianBlur(cv2.warpAffine(m.astype(np.float32),M,(100,100)),(0,0),0.8)[...,None]
        out=(big*bm+out*(1-bm)).astype(np.uint8)
    return out
def to_t(b):
    b=np.stack(b); o=(100-a.central)//2; b=b[:,o:o+a.central,o:o+a.central]
    t=torch.from_numpy(np.ascontiguousarray(b)).permute(0,3,1,2).float()/255.
    t=F.interpolate(t,size=(a.size,a.size),mode='bilinear',align_corners=False,antialias=True)
    if a.gray: t=t.mean(1,keepdim=True)
    return (t-0.5)/0.25
class Net(nn.Module):
    def __init__(s,w=32,cin=3):
        super().__init__()
        L=[];c=cin
        for o in (w,2*w,4*w,4*w):
            L+=[nn.Conv2d(c,o,3,padding=1),nn.BatchNorm2d(o),nn.ReLU(),nn.Conv2d(o,o,3,padding=1),nn.BatchNorm2d(o),nn.ReLU(),nn.MaxPool2d(2)];c=o
        s.f=nn.Sequential(*L); s.h=nn.Linear(c,1)
    def forward(s,x): return s.h(s.f(x).mean((2,3))).squeeze(1)
net=Net(a.width,1 if a.gray else 3); opt=torch.optim.AdamW(net.parameters(),1e-3,weight_decay=1e-4)
Xtr=X[tr][keep]; Mtr=[masks[i] for i in keep]
def aug(x):
    k=rng.integers(4); x=np.rot90(x,k);
    if rng.random()<.5: x=x[:,::-1]
    return np.ascontiguousarray(x)
sched=torch.optim.lr_scheduler.OneCycleLR(opt,2e-3,total_steps=a.epochs*((len(Xtr)+31)//32))
t0=time.time()
for ep in range(a.epochs):
    net.train(); perm=rng.permutation(len(Xtr)); tot=0
    for b in range(0,len(perm),32):
        ids=perm[b:b+32]
        pos=[aug(pseudo(Xtr[i],Mtr[i])) for i in ids]; neg=[aug(enlarge(Xtr[i],Mtr[i],rng.uniform(0.9,1.1),1+rng.uniform(-a.dark,a.dark)) if a.match else Xtr[i]) for i in ids]
        xb=to_t(neg+pos); yb=torch.cat([torch.zeros(len(ids)),torch.ones(len(ids))])
        loss=F.binary_cross_entropy_with_logits(net(xb),yb); opt.zero_grad(); loss.backward(); opt.step(); sched.step(); tot+=loss.item()
    if ep%5==4 or ep==a.epochs-1:
        net.eval()
        with torch.no_grad(): s=torch.cat([net(to_t(list(X[te][i:i+256]))) for i in range(0,len(te),256)]).numpy()
        print(ep, round(tot,2), 'AUROC', round(roc_auc_score(y[te],s),3), f'{time.time()-t0:.0f}s', flush=True)
np.save(f'scores_sa{a.tag}_f{a.fold}_s{a.seed}.npy',s)
r=dict(fold=a.fold,seed=a.seed,auroc=roc_auc_score(y[te],s)); 
for c in ['ASC-US','LSIL']:
    mm=(Y[te]=='NILM')|(Y[te]==c); r[c]=roc_auc_score(y[te][mm],s[mm])
print(json.dumps({k:round(v,3) if isinstance(v,float) else v for k,v in r.items()}), vars(a))
