"""Policy data kept in the repository (``policies/``), reviewed and committed like code.

* ``promotion-gates.yaml``: which gates a tuple must pass to move onto each channel.
* ``licenses/*.yaml``: license texts (by sha256) that someone has read, with who and when.
* ``code-reviews/*.yaml``: remote-code files (by sha256) that someone has read.

Review files are written by ``k3a review license|code``; humans may edit them too, so every
field is validated and a bad file is named in the error.
"""

from __future__ import annotations

import os
import tempfile
from datetime import date
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from k3artifacts.errors import ConfigError, plain_validation_errors
from k3artifacts.releases.channels import CHANNEL_NAME

GATES_FILE = "promotion-gates.yaml"
LICENSES_DIR = "licenses"
CODE_REVIEWS_DIR = "code-reviews"

GateName = Literal["artifact", "license", "remote_code", "evaluation"]
GATE_NAMES: tuple[str, ...] = ("artifact", "license", "remote_code", "evaluation")
SHA256_HEX = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EvaluationPolicy(_Strict):
    min_pass_rate: float = Field(ge=0.0, le=1.0)
    #: Only reports of this suite count; None: any suite.
    suite: str | None = None


class ChannelPolicy(_Strict):
    gates: list[GateName]
    evaluation: EvaluationPolicy | None = None
    #: The rollback flow waits for a release engineer's approval before moving this channel
    #: back. Promotion through the flow always waits for one; a rollback is an incident
    #: response, so by default it does not.
    rollback_approval: bool = False

    @model_validator(mode="after")
    def _evaluation_configured(self) -> ChannelPolicy:
        if "evaluation" in self.gates and self.evaluation is None:
            raise ValueError("the evaluation gate needs `evaluation: {min_pass_rate: ...}`")
        if len(set(self.gates)) != len(self.gates):
            raise ValueError("a gate is listed twice")
        return self


class GatePolicy(_Strict):
    schema_version: Literal[1] = 1
    channels: dict[str, ChannelPolicy]

    @field_validator("channels")
    @classmethod
    def _names(cls, value: dict[str, ChannelPolicy]) -> dict[str, ChannelPolicy]:
        for name in value:
            if not CHANNEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid channel name")
        return value


class LicenseReview(_Strict):
    sha256: str = Field(pattern=SHA256_HEX)
    reviewed_by: str = Field(min_length=1)
    reviewed_on: date
    repo_id: str | None = None
    commit: str | None = None
    #: The model card's license name at review time, for people reading the file.
    license: str | None = None
    note: str | None = None


class CodeReview(_Strict):
    sha256: str = Field(pattern=SHA256_HEX)
    path: str
    reviewed_by: str = Field(min_length=1)
    reviewed_on: date
    repo_id: str | None = None
    commit: str | None = None
    note: str | None = None


class LicenseReviewFile(_Strict):
    reviews: list[LicenseReview] = Field(default_factory=list)


class CodeReviewFile(_Strict):
    reviews: list[CodeReview] = Field(default_factory=list)


def _load_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"policy file {path} does not exist",
            hint="pass --policies DIR (or set K3A_POLICIES) to the checkout's policies/ directory",
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"policy file {path} is not valid YAML: {exc}") from None


def _validate(model: type[BaseModel], path: Path, data: object):  # type: ignore[no-untyped-def]
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError(
            f"policy file {path} is malformed: {plain_validation_errors(exc)}"
        ) from None


def load_gate_policy(policies_dir: Path) -> GatePolicy:
    path = Path(policies_dir) / GATES_FILE
    return _validate(GatePolicy, path, _load_yaml(path))


def _review_files(policies_dir: Path, sub: str) -> list[Path]:
    folder = Path(policies_dir) / sub
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def load_license_reviews(policies_dir: Path) -> dict[str, tuple[LicenseReview, Path]]:
    """Reviewed license sha256 -> (its first review, the file holding it)."""
    found: dict[str, tuple[LicenseReview, Path]] = {}
    for path in _review_files(policies_dir, LICENSES_DIR):
        for review in _validate(LicenseReviewFile, path, _load_yaml(path)).reviews:
            found.setdefault(review.sha256, (review, path))
    return found


def load_code_reviews(policies_dir: Path) -> dict[str, tuple[CodeReview, Path]]:
    found: dict[str, tuple[CodeReview, Path]] = {}
    for path in _review_files(policies_dir, CODE_REVIEWS_DIR):
        for review in _validate(CodeReviewFile, path, _load_yaml(path)).reviews:
            found.setdefault(review.sha256, (review, path))
    return found


def review_file_for(policies_dir: Path, sub: str, repo_id: str) -> Path:
    """One file per upstream repo (``moonshotai--Kimi-K3.yaml``): small diffs, few conflicts."""
    return Path(policies_dir) / sub / (repo_id.replace("/", "--") + ".yaml")


_HEADERS: dict[type[BaseModel], str] = {
    LicenseReviewFile: "# License texts someone has read, by sha256. "
    "Written by `k3a review license`;\n"
    "# commit this file: the license gate passes only for a sha256 listed here.\n",
    CodeReviewFile: "# Remote-code files someone has read, by sha256. "
    "Written by `k3a review code`;\n"
    "# commit this file: the remote_code gate passes only for files listed here.\n",
}


def append_reviews(path: Path, file_model: type[BaseModel], new: list[BaseModel]) -> None:
    """Append reviews to a review file, atomically (rename), keeping the ones already there."""
    existing = _validate(file_model, path, _load_yaml(path)) if path.exists() else file_model()
    updated = file_model(reviews=[*existing.reviews, *new])  # type: ignore[call-arg]
    body = yaml.safe_dump(
        updated.model_dump(mode="python", exclude_none=True), sort_keys=False, allow_unicode=True
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(_HEADERS[file_model] + body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
