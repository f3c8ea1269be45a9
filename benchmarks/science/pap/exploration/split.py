import numpy as np
def dev_folds(Y, I):
    """fold A: train NILM early half of dev, test later half (all classes); fold B: reverse."""
    folds=[]
    early=np.zeros(len(Y),bool)
    for c in np.unique(Y):
        m=np.flatnonzero(Y==c); m=m[np.argsort(I[m])]
        early[m[:len(m)//2]]=True
    for tr_half in (early, ~early):
        tr=np.flatnonzero(tr_half&(Y=='NILM')); te=np.flatnonzero(~tr_half)
        folds.append((tr,te))
    return folds
