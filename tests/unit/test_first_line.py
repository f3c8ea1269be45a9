"""What a one-line error quotes of a library's exception: its first line that says something."""

from __future__ import annotations

import pytest

from cyto.errors import first_line

#: OpenVINO's message for a compiled model it cannot import, as OpenVINO 2025 raises it
OPENVINO = (
    "Exception from src/inference/src/cpp/core.cpp:217:\n"
    "Exception from src/inference/src/dev/plugin.cpp:74:\n"
    "Check 'requirements_magic == runtime_requirements_magic' failed at "
    "src/plugins/intel_cpu/src/plugin.cpp:789:\n"
    "[CPU] Cannot import compiled blob: incompatible runtime requirements magic.\n\n\n"
)


@pytest.mark.parametrize(
    "text, said",
    [
        # hostile round 65 (4): a damaged kept engine was said "(Exception from
        # src/inference/src/cpp/core.cpp:217:)", a source location and nothing else
        (OPENVINO, "[CPU] Cannot import compiled blob: incompatible runtime requirements magic."),
        ("Exception from a.cpp:1:\n\n", "Exception from a.cpp:1:"),  # nothing else: as it is
        ("disk full\nmore", "disk full"),
        ("", "OSError"),
    ],
)
def test_the_first_line_that_says_what_went_wrong_is_quoted(text, said):
    assert first_line(OSError(text) if text else OSError()) == said
