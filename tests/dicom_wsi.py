"""A DICOM whole-slide image (VL Whole Slide Microscopy Image, TILED_FULL) written with pydicom,
for the tests: one instance per pyramid level, uncompressed RGB tiles, so what OpenSlide reads
back is the pixels given, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"


def write_dicom_wsi(
    folder: Path,
    levels: list[np.ndarray],
    mpp: float,
    tile: int = 256,
    series_uid: str | None = None,
    study_uid: str | None = None,
    first_instance: int = 0,
    jpeg_quality: int | None = None,
) -> list[Path]:
    """Write ``levels`` (uint8 RGB arrays, largest first, each half the one before) as one
    DICOM series in ``folder``; returns the files. ``mpp`` is level 0's um per pixel;
    ``first_instance``: the number of the first instance (its file ``level-N.dcm``), for
    instances added to a series written before. ``jpeg_quality``: frames compressed as baseline
    JPEG (Pillow, YCbCr with 4:2:2 chroma: ``YBR_FULL_422``, which OpenSlide reads), else
    uncompressed RGB."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid
    from pydicom.uid import JPEGBaseline8Bit as JPEG

    folder.mkdir(parents=True, exist_ok=True)
    series = series_uid or generate_uid()
    study, frame_ref, pyramid = study_uid or generate_uid(), generate_uid(), generate_uid()
    base_h, base_w = levels[0].shape[:2]
    files = []
    for i, rgb in enumerate(levels, start=first_instance):
        h, w = rgb.shape[:2]
        across, down = -(-w // tile), -(-h // tile)
        padded = np.full((down * tile, across * tile, 3), 255, np.uint8)
        padded[:h, :w] = rgb[..., :3]
        frames = (
            padded.reshape(down, tile, across, tile, 3).swapaxes(1, 2).reshape(-1, tile, tile, 3)
        )
        sop = generate_uid()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = WSI_SOP_CLASS
        meta.MediaStorageSOPInstanceUID = sop
        meta.TransferSyntaxUID = ExplicitVRLittleEndian if jpeg_quality is None else JPEG
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = WSI_SOP_CLASS, sop
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.FrameOfReferenceUID, ds.PyramidUID = frame_ref, pyramid
        ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "SM", 1, i + 1
        ds.ImageType = ["ORIGINAL" if i == 0 else "DERIVED", "PRIMARY", "VOLUME", "NONE"]
        ds.Manufacturer = "cyto tests"
        ds.DimensionOrganizationType = "TILED_FULL"
        ds.TotalPixelMatrixColumns, ds.TotalPixelMatrixRows = w, h
        ds.TotalPixelMatrixFocalPlanes = 1
        ds.NumberOfOpticalPaths = 1
        path_item = Dataset()
        path_item.OpticalPathIdentifier = "0"
        ds.OpticalPathSequence = [path_item]
        ds.Rows = ds.Columns = tile
        ds.NumberOfFrames = len(frames)
        photometric = "RGB" if jpeg_quality is None else "YBR_FULL_422"
        ds.SamplesPerPixel, ds.PhotometricInterpretation, ds.PlanarConfiguration = (
            3,
            photometric,
            0,
        )
        ds.BitsAllocated = ds.BitsStored = 8
        ds.HighBit, ds.PixelRepresentation = 7, 0
        ds.ImagedVolumeWidth = base_w * mpp / 1000.0  # mm
        ds.ImagedVolumeHeight = base_h * mpp / 1000.0
        measures = Dataset()
        spacing_mm = mpp * (base_w / w) / 1000.0
        measures.PixelSpacing = [f"{spacing_mm:.10g}", f"{spacing_mm:.10g}"]
        measures.SliceThickness = "0.0005"
        shared = Dataset()
        shared.PixelMeasuresSequence = [measures]
        ds.SharedFunctionalGroupsSequence = [shared]
        if jpeg_quality is None:
            ds.PixelData = frames.tobytes()
        else:
            from pydicom.encaps import encapsulate

            ds.PixelData = encapsulate([_jpeg(f, jpeg_quality) for f in frames])
            ds["PixelData"].VR = "OB"
            ds["PixelData"].is_undefined_length = True
            ds.LossyImageCompression = "01"
        out = folder / f"level-{i}.dcm"
        ds.save_as(out, enforce_file_format=True)
        files.append(out)
    return files


def _jpeg(frame: np.ndarray, quality: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "JPEG", quality=quality, subsampling=1)
    return buf.getvalue()
