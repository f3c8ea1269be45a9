import numpy as np
from pathlib import Path
from PIL import Image
import os
ROOT=Path(os.environ.get('CYTO_SHARED_DATA', Path(__file__).resolve().parents[5] / 'shared' / 'data')) / 'cric'
CLASSES=['NILM','ASC-US','LSIL','ASC-H']
def pad(a, size=100):
    h,w=a.shape[:2]
    if (h,w)==(size,size): return a
    edge=np.concatenate([a[0],a[-1],a[:,0],a[:,-1]])
    out=np.empty((size,size,3),np.uint8); out[:]=np.median(edge,0).astype(np.uint8)
    y0=(size-h)//2; x0=(size-w)//2
    out[y0:y0+h,x0:x0+w]=a
    return out
def load(stage='dev', frac=0.25, square_only=False):
    X=[];Y=[];I=[]
    for c in CLASSES:
        fs=sorted((ROOT/c).glob('*.png'), key=lambda p:int(p.stem))
        cut=len(fs)-int(round(frac*len(fs)))
        sel=fs[:cut] if stage=='dev' else fs[cut:]
        if stage=='final' and c=='ASC-H': sel=[]
        for f in sel:
            a=np.asarray(Image.open(f).convert('RGB'))
            if square_only and a.shape[:2]!=(100,100): continue
            X.append(pad(a)); Y.append(c); I.append(int(f.stem))
    return np.stack(X), np.array(Y), np.array(I)
