package ij.process;
/** Stand-in for ImageJ (never called). */
public class ImageProcessor { public static final int BILINEAR = 1, NEAREST_NEIGHBOR = 0;
  public void setInterpolationMethod(int m) {} public Object getPixels() { throw new UnsupportedOperationException(); }
  public ImageProcessor resize(int w, int h, boolean a) { throw new UnsupportedOperationException(); } }
