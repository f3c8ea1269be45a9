"""The pieces of the DICOMweb reader that need no server: a multipart answer split into its
frames (binary content that holds CRLFs and dashes included), and the tile a frame holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cyto.slides.dicom import WsiLevel
from cyto.slides.dicomweb import _multipart, _syntax

BOUNDARY = "a1b2-c3d4"


def _body(frames: list[bytes], syntax: str) -> bytes:
    out = b""
    for f in frames:
        out += f"--{BOUNDARY}\r\nContent-Type: application/octet-stream; ".encode()
        out += f"transfer-syntax={syntax}\r\n\r\n".encode() + f + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=6))
def test_a_multipart_answer_gives_each_frame_as_sent(frames):
    kind = f'multipart/related; type="application/octet-stream"; boundary="{BOUNDARY}"'
    parts = _multipart(_body(frames, "1.2.840.10008.1.2.4.50"), kind)
    assert [content for _, content in parts] == frames
    assert {_syntax(h["content-type"]) for h, _ in parts} == {"1.2.840.10008.1.2.4.50"}


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(16, 512), st.integers(16, 512))
def test_each_pixel_lies_in_the_tile_of_its_frame(width, height, tw, th):
    lv = WsiLevel("1.2", width, height, tw, th, 0, 3, "RGB", None)
    x, y = width - 1, height - 1
    (tx, ty) = lv.tiles(x, y, 1, 1)[0]
    assert lv.frame(tx, ty) == lv.across * lv.down  # the last pixel: the last frame
    assert lv.tiles(0, 0, width, height)[-1] == (lv.across - 1, lv.down - 1)
    assert len(lv.tiles(0, 0, width, height)) == lv.across * lv.down
