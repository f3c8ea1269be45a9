"""Is this slide adequate? The specimen-adequacy rule and its named presets.

A slide is judged from the quality of its cells and of its scanned area
(:mod:`cyto.infer.quality`): how many cells are *evaluable* (in focus, not crowded, at the
model's scale), the share of detected cells that are not, the crowded share of the scanned area,
the share of the slide that was glass or skipped, and the cell-scale check. The result is
``satisfactory``, ``limited`` (with reasons) or ``unsatisfactory`` (with reasons), in the summary
as ``summary["adequacy"]``.

Where the numbers come from (each preset says it in ``sources``):

- ``lbc-cervical``: at least 5,000 well-visualised, well-preserved squamous cells for a
  liquid-based preparation, and ``smear-conventional``: an estimated 8,000 to 12,000 for a
  conventional smear; both from the Bethesda System (Solomon et al., "The 2001 Bethesda System",
  JAMA 2002; 287:2114-2119; Nayar & Wilbur (eds), "The Bethesda System for Reporting Cervical
  Cytology", 3rd ed., Springer 2015). Bethesda also calls a specimen with more than 75% of its
  squamous cells obscured unsatisfactory, and asks a 50-75% obscured one to be reported as
  partially obscured: cyto applies those two shares to the cells that are *not evaluable* (out of
  focus or crowded), which is cyto's reading, not Bethesda's wording.
- ``bone-marrow``: a differential count of 500 nucleated cells on the aspirate (ICSH,
  Lee et al., "ICSH guidelines for the standardization of bone marrow specimens and reports",
  Int J Lab Hematol 2008; 30:349-364). Fewer than 500 evaluable cells cannot support that count.
- ``general`` (the default): no cell-count minimum, which depends on the specimen; the
  preparation-independent checks only (no evaluable cell, the Bethesda-style shares of cells
  not evaluable, the cell scale, crowding and glass), every threshold but the shares a cyto
  choice.
- ``none``: no rule; ``cyto score`` writes what it wrote before adequacy existed.

A TOML file (``--adequacy lab.toml``) gives a rule of one's own: a ``[adequacy]`` table with
the fields of :class:`AdequacyRule`, optionally ``base = "PRESET"`` whose fields it overrides.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from cyto.errors import ConfigError
from cyto.flags import UM_PER_PX, passing, said

SATISFACTORY, LIMITED, UNSATISFACTORY = "satisfactory", "limited", "unsatisfactory"
RESULTS = (SATISFACTORY, LIMITED, UNSATISFACTORY)
DEFAULT = "general"

_BETHESDA = (
    "the Bethesda System for Reporting Cervical Cytology (Solomon et al., JAMA 2002; "
    "287:2114-2119; Nayar & Wilbur, 3rd ed., Springer 2015)"
)
_BETHESDA_OBSCURED = (
    "Bethesda's obscuring rule (more than 75% of squamous cells obscured: unsatisfactory; "
    "50-75%: partially obscured), applied by cyto to cells not evaluable (out of focus or "
    "crowded)"
)
_ICSH = (
    "ICSH guidelines for the standardization of bone marrow specimens and reports (Lee et al., "
    "Int J Lab Hematol 2008; 30:349-364): a 500-cell differential count"
)
_CYTO = "a cyto choice (docs/how-to/adequacy.md)"
_STAIN_SOURCE = (
    "the model has learned its training cells' stain only; cells of another stain are found "
    "and measured otherwise (" + _CYTO + ")"
)


@dataclass(frozen=True)
class AdequacyRule:
    """An adequacy rule: the thresholds a slide is held to (None: not checked).

    Attributes:
        name: the preset's name, or the TOML file's.
        min_cells: fewer evaluable cells than this: unsatisfactory.
        limited_cells: fewer evaluable cells than this (but at least ``min_cells``): limited.
        unsatisfactory_not_evaluable: a larger share of the detected cells not evaluable:
            unsatisfactory.
        limited_not_evaluable: a larger share not evaluable: limited.
        limited_crowded_area: a larger share of the scanned tiles crowded: limited.
        limited_glass: a larger share of the slide glass or skipped: limited.
        check_scale: cells off the model's scale (the cell-scale check): unsatisfactory; cells
            that look as the model's where the slide's resolution says otherwise (that
            resolution is likely wrong, and every um^2 measure with it): limited.
        check_stain: cells stained otherwise than the model's training cells (the stain
            check): limited (they are found, measured and scored as cells of another stain).
        sources: where each number comes from, by field name.
    """

    name: str
    min_cells: int | None = 1
    limited_cells: int | None = None
    unsatisfactory_not_evaluable: float | None = 0.75
    limited_not_evaluable: float | None = 0.5
    limited_crowded_area: float | None = 0.5
    limited_glass: float | None = 0.9
    check_scale: bool = True
    check_stain: bool = True
    sources: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"adequacy rule {self.name!r}"
        for name in ("min_cells", "limited_cells"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"{where}: {name} must be a whole number >= 0, got {v!r}")
        for name in (
            "unsatisfactory_not_evaluable",
            "limited_not_evaluable",
            "limited_crowded_area",
            "limited_glass",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ConfigError(f"{where}: {name} must be a share between 0 and 1, got {v!r}")
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"{where}: {name} must be a share between 0 and 1, got {v!r}")
        for name in ("check_scale", "check_stain"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{where}: {name} must be true or false, got {getattr(self, name)!r}"
                )
        # a band that starts where the harsher one already ends can never be given
        for low, high, band, fix in (
            ("min_cells", "limited_cells", "limited_cells", "raise"),
            (
                "limited_not_evaluable",
                "unsatisfactory_not_evaluable",
                "limited_not_evaluable",
                "lower",
            ),
        ):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a >= b:
                raise ConfigError(
                    f"{where}: {low} ({a}) must be below {high} ({b}), or {band} can never make "
                    f"a slide limited; {fix} {band} or turn it off (false)"
                )

    def as_json(self) -> dict:
        return asdict(self)

    def key(self) -> dict:
        """The rule as a result's output key holds it (:mod:`cyto.reuse`): :meth:`as_json`, less
        each check added after keys were recorded while it is at its default, with its source
        (a slide or a calibration of the cyto before ``check_stain`` matched no later run, and a
        calibrated slide was told it was "scored unlike the calibration slides")."""
        out = self.as_json()
        for name, default in ADDED_LATER.items():
            if out.get(name) == default:
                del out[name]
                out["sources"].pop(name, None)
        return out


#: checks added to the rule after output keys held it, with their defaults (AdequacyRule.key)
ADDED_LATER = {"check_stain": True}

PRESETS: dict[str, AdequacyRule | None] = {
    "none": None,
    "general": AdequacyRule(
        "general",
        sources={
            "min_cells": "no evaluable cell: nothing to judge (" + _CYTO + ")",
            "unsatisfactory_not_evaluable": _BETHESDA_OBSCURED,
            "limited_not_evaluable": _BETHESDA_OBSCURED,
            "limited_crowded_area": _CYTO,
            "limited_glass": _CYTO,
            "check_scale": "the model ranks cells at its training scale only (" + _CYTO + ")",
            "check_stain": _STAIN_SOURCE,
        },
    ),
    "lbc-cervical": AdequacyRule(
        "lbc-cervical",
        min_cells=5000,
        limited_glass=None,  # a liquid-based preparation is a small circle on the glass
        sources={
            "min_cells": "at least 5,000 well-visualised, well-preserved squamous cells for a "
            "liquid-based preparation: " + _BETHESDA,
            "unsatisfactory_not_evaluable": _BETHESDA_OBSCURED,
            "limited_not_evaluable": _BETHESDA_OBSCURED,
            "limited_crowded_area": _CYTO,
            "check_scale": _CYTO,
            "check_stain": _STAIN_SOURCE,
        },
    ),
    "smear-conventional": AdequacyRule(
        "smear-conventional",
        min_cells=8000,
        limited_cells=12000,
        sources={
            "min_cells": "an estimated minimum of 8,000 to 12,000 well-preserved squamous cells "
            "for a conventional smear: " + _BETHESDA + "; below 8,000 unsatisfactory",
            "limited_cells": "within Bethesda's 8,000-12,000 estimate: limited (" + _CYTO + ")",
            "unsatisfactory_not_evaluable": _BETHESDA_OBSCURED,
            "limited_not_evaluable": _BETHESDA_OBSCURED,
            "limited_crowded_area": _CYTO,
            "limited_glass": _CYTO,
            "check_scale": _CYTO,
            "check_stain": _STAIN_SOURCE,
        },
    ),
    "bone-marrow": AdequacyRule(
        "bone-marrow",
        min_cells=500,
        limited_glass=None,
        sources={
            "min_cells": _ICSH
            + "; fewer evaluable cells cannot support it (unsatisfactory: "
            + _CYTO
            + ")",
            "unsatisfactory_not_evaluable": "Bethesda's obscuring shares, borrowed (" + _CYTO + ")",
            "limited_not_evaluable": "Bethesda's obscuring shares, borrowed (" + _CYTO + ")",
            "limited_crowded_area": _CYTO,
            "check_scale": _CYTO,
            "check_stain": _STAIN_SOURCE,
        },
    ),
}


_THRESHOLDS = (
    "min_cells",
    "limited_cells",
    "unsatisfactory_not_evaluable",
    "limited_not_evaluable",
    "limited_crowded_area",
    "limited_glass",
)


def resolve(spec: str) -> AdequacyRule | None:
    """The rule ``--adequacy`` names: a preset (None for ``none``) or a TOML file's."""
    if spec in PRESETS:
        return PRESETS[spec]
    from cyto.location import local_path

    path = local_path("adequacy", spec, "a rule preset, or a RULE.toml on this machine")
    if path.suffix.lower() != ".toml":
        raise ConfigError(
            f"{said('adequacy')} must be one of {', '.join(PRESETS)} or a TOML file (RULE.toml), "
            f"got {spec!r}"
        )
    return read_rule(path)


def read_rule(path: Path) -> AdequacyRule:
    """A rule from a TOML file's ``[adequacy]`` table (``base = "PRESET"`` to override one)."""
    import tomllib

    given = passing("adequacy", Path(path))  # --adequacy PATH, or adequacy='PATH' from Python
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{given}: cannot read it ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{given}: not a TOML file ({exc})") from exc
    table = data.get("adequacy")
    if not isinstance(table, dict):
        raise ConfigError(f"{given}: no [adequacy] table (see docs/how-to/adequacy.md)")
    table = dict(table)
    base_name = table.pop("base", None)
    known = {f.name for f in fields(AdequacyRule)} - {"sources"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{given}: unknown key(s) {', '.join(unknown)}; known: base, {', '.join(sorted(known))}"
        )
    if base_name is not None:
        base = PRESETS.get(base_name) if isinstance(base_name, str) else None
        if base is None:
            names = ", ".join(k for k, v in PRESETS.items() if v is not None)
            raise ConfigError(f"{given}: base must be one of {names}, got {base_name!r}")
    else:
        base = AdequacyRule(Path(path).stem)
    # a number a file states is the file's, not the preset's source
    sources = {k: v for k, v in base.sources.items() if k not in table}
    sources.update({k: f"{Path(path).name}" for k in table if k != "name"})
    # TOML has no null: false turns a threshold off
    for k in _THRESHOLDS:
        if table.get(k) is False:
            table[k] = None
    table.setdefault("name", Path(path).stem)
    try:
        return replace(base, **table, sources=sources)
    except ConfigError as exc:  # a bad value: said with the file it is in
        raise ConfigError(f"{given}: {exc}") from exc


def judge(rule: AdequacyRule, m: dict) -> dict:
    """The adequacy block for a slide's measures ``m`` (:func:`cyto.infer.quality` and the
    finish step): ``{"preset", "result", "reasons", "cells_evaluable", ...}``.

    ``m`` holds ``cells_detected``, ``cells_evaluable``, ``not_evaluable_share``,
    ``out_of_focus_share`` (None: focus not checked), ``crowded_share``,
    ``crowded_area_share``, ``glass_or_skipped_share`` and ``cell_scale`` (the scale check,
    None when the bundle records no training nucleus share)."""
    unsat: list[str] = []
    limited: list[str] = []
    n_eval, n_det = m["cells_evaluable"], m["cells_detected"]
    scale = m.get("cell_scale") or {}
    if rule.check_scale and scale.get("off_scale"):
        if scale.get("mpp_off_scale"):  # the recorded resolutions, crops not resampled
            r = scale["mpp_ratio"]  # the model's mpp over the slide's: < 1, cells smaller
            # by the recorded resolutions, not as measured (they read 1.06x where this said
            # "look 1.29x"), and --rescale only if the recorded one is true (hostile round 23)
            how = f"{1 / r:.2f}x smaller" if r < 1 else f"{r:.2f}x larger"
            are = "are"
            # the slide's resolution as read: its file's, or a --mpp given (round 34, 3)
            how += " than its training cells by the slide's resolution against the model's"
            why = (
                f"if that is its true resolution, pass {passing('rescale')}; if not, pass its "
                f"true {passing('slide_mpp', UM_PER_PX)} and {passing('rescale')}"
            )
        else:
            f = scale["factor"]  # the model's nucleus share over the slide's: > 1, smaller
            are = "look"
            how = (f"{f:.2f}x smaller" if f > 1 else f"{1 / f:.2f}x larger") + (
                " than its training cells"
            )
            why = f"is the resolution right? {said('slide_mpp')}, {said('rescale')}"
            if "to_pass" in scale:  # advice only for what was not passed (cyto.flags.to_pass)
                why = (
                    f"is the resolution right? pass {scale['to_pass']}"
                    if scale["to_pass"]
                    else f"is the resolution right? check {said('slide_mpp')}"
                )
            if scale.get("detection_differs"):  # the detection the user gave, not the mpp
                d = scale["detection_differs"]
                why = (
                    f"{passing('detection', d['detection'])} is not the detection of the "
                    f"model's training cells ({d['model']}): leave out {said('detection')}"
                )
            elif scale.get("larger_at_recorded_mpp"):  # a lesion or a wrong resolution
                why = (
                    "a lesion-rich specimen, or a wrong resolution, which "
                    f"the check cannot tell apart; read it by eye, or check its resolution "
                    f"({said('slide_mpp')})"
                )
            elif scale.get("cut_by"):  # the crop side the user gave, not the slide's mpp
                cut = scale["cut_by"]
                why = (
                    f"{passing('patch_size', cut['patch_size'])} cuts them unlike the model's "
                    f"{cut['model_patch_size']} px crops: leave out {said('patch_size')}"
                )
        unsat.append(f"cells off the model's scale (they {are} {how}: {why})")
    elif (
        rule.check_scale and scale.get("larger_at_recorded_mpp") and scale.get("off_scale") is None
    ):
        # larger cells not judged off scale where most are out of focus or crowded (which look
        # larger too), while the scale warning asked for the slide to be read by eye: said here
        # too, not left to the focus reason alone (hostile round 23: "limited" with no word)
        limited.append(
            f"cells look {1 / scale['factor']:.2f}x larger than its training cells, which blur "
            "or crowding gives too, and so do a lesion-rich specimen and a wrong resolution: "
            "read it by eye"
        )
    if rule.check_scale and scale.get("mpp_contradicted"):
        # the scale check said the resolution is likely wrong; the cells were scored as they
        # look, but found and measured at it: "satisfactory" with no word (hostile round 58)
        limited.append(
            "cells that look as the model's training cells where the slide's resolution says "
            "otherwise: that resolution is likely wrong, and every um^2 measure with it"
        )
    stain = m.get("cell_stain") or {}
    if rule.check_stain and stain.get("advised"):
        # an MGG model on a Pap slide found 39-69 cells of 682 and was "satisfactory"
        # (hostile round 58): the stain check's warning was the only word
        limited.append(
            f"cells stained otherwise than the model's training cells ({stain['degrees']:.0f} "
            "degrees apart): found, measured and scored as cells of another stain or lab; "
            "read it by eye, or train on this lab's normal cells"
        )
    if rule.min_cells is not None and n_eval < rule.min_cells:
        unsat.append(
            "no evaluable cell"
            if n_eval == 0
            else f"{n_eval:,} evaluable cells, fewer than the {rule.min_cells:,} {rule.name} asks"
        )
    elif rule.limited_cells is not None and n_eval < rule.limited_cells:
        limited.append(
            f"{n_eval:,} evaluable cells, fewer than the {rule.limited_cells:,} {rule.name} "
            "asks for a satisfactory slide"
        )
    share = m["not_evaluable_share"]
    if n_det and share is not None:
        detail = _not_evaluable_words(m)
        if rule.unsatisfactory_not_evaluable is not None and share > (
            rule.unsatisfactory_not_evaluable
        ):
            unsat.append(
                f"{share:.0%} of the detected cells not evaluable ({detail}), more than "
                f"{rule.unsatisfactory_not_evaluable:.0%}"
            )
        elif rule.limited_not_evaluable is not None and share > rule.limited_not_evaluable:
            limited.append(
                f"{share:.0%} of the detected cells not evaluable ({detail}), more than "
                f"{rule.limited_not_evaluable:.0%}"
            )
    crowded = m.get("crowded_area_share")
    if (
        m.get("crowding_counted", True)  # not under --detection tissue
        and rule.limited_crowded_area is not None
        and crowded is not None
        and crowded > rule.limited_crowded_area
    ):
        limited.append(
            f"{crowded:.0%} of the scanned area crowded, more than {rule.limited_crowded_area:.0%}"
        )
    glass = m.get("glass_or_skipped_share")
    if rule.limited_glass is not None and glass is not None and glass > rule.limited_glass:
        limited.append(
            f"{glass:.0%} of the slide {_no_cell_words(m)}, more than {rule.limited_glass:.0%}"
        )
    result = UNSATISFACTORY if unsat else LIMITED if limited else SATISFACTORY
    return {
        "preset": rule.name,
        "result": result,
        "reasons": unsat + limited if unsat else limited,
        **m,
        "rule": rule.as_json(),
    }


def _no_cell_words(m: dict) -> str:
    """Where the slide's share with no cell to read lies: skipped as glass (never read), or
    tissue read where no cell was found. A slide of tissue whose cells were all missed (its
    resolution unknown, so nuclei looked for at another size) was said "100% glass"."""
    skipped, empty = m.get("skipped_share"), m.get("empty_scanned_share")
    scanned = m.get("tiles_scanned")
    if skipped is None or empty is None or not scanned:
        return "glass or skipped (no cells to read)"
    if m.get("cells_detected") == 0:
        return (
            f"with no cell to read ({skipped:.0%} skipped as glass; no cell found in any of the "
            f"{scanned:,} tiles with tissue: is the resolution right?)"
        )
    return (
        f"with no cell to read ({skipped:.0%} skipped as glass; no cell found in {empty:.0%} of "
        f"the {scanned:,} tiles with tissue)"
    )


def _not_evaluable_words(m: dict) -> str:
    """The shares of cells not evaluable, each with what it is measured against: the model's
    golden cells (focus) and its crop (crowding). Both are the model's, so one slide can be
    satisfactory under one model and not under another; the words said it as a fact of the
    slide (hostile round 66, 4)."""
    parts = []
    if m.get("out_of_focus_share") is not None:
        parts.append(f"{m['out_of_focus_share']:.0%} out of focus against the model's golden cells")
    if m.get("crowding_counted", True):
        crop, others = m.get("crowding_crop_px"), m.get("crowding_others")
        within = (
            f": more than {others} other cells within the model's {crop} px crop"
            if crop and others is not None
            else ""
        )
        parts.append(f"{m['crowded_share']:.0%} crowded{within}")
    if (m.get("cell_scale") or {}).get("off_scale"):
        parts.append("all off scale")
    return ", ".join(parts)


def triage_words(triage: str, adequacy: dict | None) -> str:
    """The slide test's label on a slide judged by the rule: never 'no excess' on an
    unsatisfactory slide; an excess is still said."""
    if not adequacy or adequacy["result"] == SATISFACTORY:
        return triage
    why = "; ".join(adequacy["reasons"])
    if adequacy["result"] == UNSATISFACTORY:
        from cyto.stats.calibrate import TRIAGE_EXCESS

        if triage == TRIAGE_EXCESS:
            return f"{TRIAGE_EXCESS}; unsatisfactory: {why}"
        return f"unsatisfactory: {why}"
    return f"{triage}; limited: {why}"


def adequacy_words(adequacy: dict | None) -> str:
    """The adequacy block as a clause of the one-line report."""
    if not adequacy:
        return ""
    said = f"; adequacy ({adequacy['preset']}): {adequacy['result']}"
    said += f", {adequacy['cells_evaluable']:,} evaluable cells"
    if adequacy["reasons"]:
        said += ": " + "; ".join(adequacy["reasons"])
    return said
