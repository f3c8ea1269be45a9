"""Method configs: frozen dataclasses whose defaults are the paper's recipe.

A named preset only overrides fields. A TOML or YAML file (``.yaml``/``.yml`` is YAML, any other
suffix TOML) maps one to one onto the dataclass (the same keys), and ``--set key=value`` overrides
win over both; the resolved config is printed and saved in the bundle, so there is one source of
truth.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

from cyto.errors import ConfigError
from cyto.flags import MPP_RANGE, SEED_RANGE, Range, check_seed, said, setting
from cyto.models.backbones import BACKBONES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class TrainConfig:
    """Fields every method has."""

    backbone: str = "resnet18"
    input_size: int = 224
    load_size: int | None = None  # resize patches once at load time (None: keep their size)
    mpp: float | None = None  # um/px of the training patches; cyto score warns or rescales
    epochs: int = 100
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    amp: bool = True  # mixed precision on CUDA (ignored on CPU)
    stain_norm: str = "none"  # "reinhard": colours moved to the training images' (cyto.data.stain)
    stain_jitter: float = 0.0  # > 0: training views get random stain colours of this strength
    #: the stain of the cells: mgg (May-Grünwald-Giemsa), pap (Papanicolaou) or he: how their
    #: morphometry is measured (cyto.detect.morphometry) and which nuclei cyto score finds
    stain: str = "mgg"

    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    #: the range of each numeric setting; a method's config adds its own fields' (merged over
    #: the classes it derives from: :meth:`ranges`). Every numeric field has one
    #: (tests/unit/test_train_ranges.py): a negative seed reached numpy raw, a negative learning
    #: rate or embedding size reached torch (hostile round 11, N17)
    RANGES: ClassVar[dict[str, Range]] = {
        # a patch side above 1024 px only reaches the allocator (100000 asked cv2 for 30 GB)
        "input_size": Range(16, 1024, "px: the side the model sees"),
        "load_size": Range(16, 1024, "px, or none: the patches' own size"),
        "mpp": MPP_RANGE,
        "epochs": Range(1),
        "batch_size": Range(1),
        "lr": Range(0, open_lo=True),
        "weight_decay": Range(0),
        "seed": SEED_RANGE,
        "stain_jitter": Range(0, 1),
    }

    @classmethod
    def ranges(cls) -> dict[str, Range]:
        """Every numeric setting's range, a subclass's over its bases'."""
        out: dict[str, Range] = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("RANGES", {}))
        return out

    def __post_init__(self) -> None:
        check_seed(self.seed, name=setting("seed"))  # the one rule for a seed, its type too
        for name, bounds in self.ranges().items():
            value = getattr(self, name)
            if not bounds.holds(value):
                raise ConfigError(f"{setting(name)} must be {bounds.words()}, got {value!r}")
        if self.backbone not in BACKBONES:
            raise ConfigError(
                f"{setting('backbone')} must be one of {', '.join(BACKBONES)}, got "
                f"{self.backbone!r}"
            )
        from cyto.data.stain import METHODS

        if self.stain_norm not in METHODS:
            raise ConfigError(
                f"{setting('stain_norm')} must be {' or '.join(METHODS)}, got {self.stain_norm!r}"
            )
        from cyto.data.morphometry import STAINS

        if self.stain not in STAINS:
            raise ConfigError(
                f"{setting('stain')} must be one of {', '.join(STAINS)}, got {self.stain!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OneClassConfig(TrainConfig):
    """Fields of the one-class methods (Deep SVDD, DROC): what they do with abnormal classes
    given beside the normal ones, which they never train on. The other methods train on those
    cells (FS-SIL) or bags (WS-SIL, ItS2CLR) and hold none back: the settings are theirs alone
    (fs-sil took ``--set holdout=0.5`` and ignored it: hostile round 39, 5)."""

    #: with abnormal classes in the folder, this share of the normal cells (the latest by file
    #: number) is held back from the training, to rank beside the abnormal cells: which of the
    #: model, the morphometric score and their fusion ranks best (--rank-by auto); 0: train on
    #: every normal cell and rank by the model alone
    holdout: float = 0.2
    #: after the ranking is chosen on held-back cells, train the bundle's model again on every
    #: normal cell (the held-out model only chose); false: the held-out model is the bundle's
    refit: bool = True

    RANGES: ClassVar[dict[str, Range]] = {"holdout": Range(0, 1)}

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.holdout < 1:  # its range's upper end is open
            raise ConfigError(f"{setting('holdout')} must be in [0, 1), got {self.holdout}")


#: the settings only a one-class method has, said where another method is given one
ONE_CLASS_ONLY = ("holdout", "refit")


def _coerce(name: str, typ: Any, value: Any) -> Any:
    """Turn a TOML value or a ``--set`` string into the field's type."""
    args = [a for a in get_args(typ) if a is not type(None)]
    optional = type(None) in get_args(typ)
    base = typ
    if get_origin(typ) in (Union, UnionType) and len(args) == 1:
        base = args[0]
    try:
        if optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
            return None
        if get_origin(base) is tuple:
            inner = get_args(base)[0] if get_args(base) else str
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(
                inner(v.strip() if isinstance(v, str) else v)
                for v in items
                if not (isinstance(v, str) and not v.strip())
            )
        if base is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if base is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if base is float:
            number = float(value)
            if not math.isfinite(number):  # nan passes every `<= 0` check and wrecks training
                raise ValueError(value)
            return number
        if base is str:
            return str(value)
        return value
    except (TypeError, ValueError) as exc:
        what = "a finite number" if base is float else getattr(base, "__name__", base)
        what = {"int": "an integer", "bool": "true or false"}.get(what, what)
        raise ConfigError(f"{setting(name)} must be {what}, got {value!r}") from exc


def read_config_file(path: Path) -> dict[str, Any]:
    """The key/value table of a TOML file, or of a YAML file (``.yaml``, ``.yml``)."""
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file {path} must be a mapping of settings (key: value), not a "
                f"{type(data).__name__}"
            )
        return data
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``--set key=value`` items as a dict (values still text; the config coerces them)."""
    pairs = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        pairs[k.strip()] = v.strip()
    return pairs


def resolve_config(
    cls: type[TrainConfig],
    preset: str | None = None,
    config_file: Path | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
    method: str | None = None,
) -> TrainConfig:
    """Defaults, then the preset, then the TOML/YAML file, then ``key=value`` overrides
    (``method``: the method's name, in a refusal)."""
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    values: dict[str, Any] = {}

    def apply(source: str, items: dict[str, Any]) -> None:
        for key, value in items.items():
            if key not in known and key in ONE_CLASS_ONLY:
                raise ConfigError(
                    f"{source}: {key!r} is a setting of the one-class methods (dsvdd, droc), "
                    "which hold normal cells back to rank beside the abnormal classes; "
                    f"{method or 'this method'} trains on the abnormal classes' cells or bags "
                    "and holds none back"
                )
            if key not in known:
                import difflib

                from cyto.flags import NEAR

                near = difflib.get_close_matches(str(key), known, n=1, cutoff=NEAR)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise ConfigError(
                    f"{source}: unknown setting {key!r}{hint}; known: {', '.join(known)}"
                )
            values[key] = _coerce(key, hints[key], value)

    if preset is not None:
        if preset not in cls.presets:
            raise ConfigError(
                f"unknown preset {preset!r}; known: {', '.join(sorted(cls.presets)) or 'none'}"
            )
        apply(f"preset {preset}", cls.presets[preset])
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        apply(str(path), read_config_file(path))
    if overrides:
        if isinstance(overrides, dict):
            apply(said("overrides"), overrides)
        else:
            apply(said("overrides"), parse_overrides(overrides))
    return cls(**values)


def to_toml(config: TrainConfig) -> str:
    """The config as TOML, readable back by :func:`resolve_config`. A setting left unset (None,
    which TOML cannot write) is a comment naming it, so every key ``--set`` takes is listed
    (``mpp``, which cyto asks for, was missing: hostile round 67, 7)."""
    lines = []
    for key, value in config.to_dict().items():
        if value is None:
            lines.append(f"# {key} = (unset: --set {key}=...)")
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif isinstance(value, (tuple, list)):
            text = (
                "["
                + ", ".join(repr(v) if not isinstance(v, str) else f'"{v}"' for v in value)
                + "]"
            )
        else:
            text = f'"{value}"'
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"
