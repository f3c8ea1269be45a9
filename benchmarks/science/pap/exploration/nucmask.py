import numpy as np, cv2
from scipy import ndimage as ndi
from skimage.filters import threshold_multiotsu
LUT=-np.log((np.arange(256,dtype=np.float32)+1)/256)
def centre_nucleus_mask(x, mpp=0.258):
    s=LUT[x].sum(-1); s=cv2.GaussianBlur(s,(0,0),0.3/mpp)
    try: t0,t1=threshold_multiotsu(s,3)
    except ValueError: return None
    nuc=s>t1
    nuc=ndi.binary_fill_holes(cv2.morphologyEx(nuc.astype(np.uint8),cv2.MORPH_OPEN,cv2.getStructuringElement(cv2.MORPH_ELLIPSE,(3,3))).astype(bool))
    lab,n=ndi.label(nuc)
    if n==0: return None
    h,w=s.shape; yy,xx=np.mgrid[:h,:w]
    sizes=np.bincount(lab.ravel()); ok=sizes>=3/mpp**2; ok[0]=False
    d2=np.where(ok[lab],(yy-h/2+.5)**2+(xx-w/2+.5)**2,1e12)
    k=np.unravel_index(np.argmin(d2),d2.shape)
    if d2[k]>=1e12: return None
    return lab==lab[k]
def enlarge(x, mask, factor, darken=1.0, rng=None):
    """nucleus enlarged by linear factor about its centroid, pasted over the cell"""
    ys,xs=np.nonzero(mask); cy,cx=ys.mean(),xs.mean()
    M=np.float32([[factor,0,cx*(1-factor)],[0,factor,cy*(1-factor)]])
    h,w=mask.shape
    big=cv2.warpAffine(x,M,(w,h),flags=cv2.INTER_LINEAR,borderMode=cv2.BORDER_REFLECT)
    bm=cv2.warpAffine(mask.astype(np.float32),M,(w,h),flags=cv2.INTER_LINEAR)
    bm=cv2.GaussianBlur(bm,(0,0),0.8)[...,None]
    if darken!=1.0:
        od=LUT[big]*darken; big=np.clip(256*np.exp(-od)-1,0,255).astype(np.uint8)
    return (big*bm+x*(1-bm)).astype(np.uint8)
