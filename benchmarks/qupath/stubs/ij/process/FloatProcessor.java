package ij.process;
public class FloatProcessor extends ImageProcessor { public FloatProcessor(int w, int h) {} }
