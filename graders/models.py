"""The graders as typed models, field for field the installed openai SDK's
(`openai/types/graders/*.py`, and `pass_threshold` as `openai/types/eval_create_params.py` adds it
to testing criteria). `graders/validate.py` builds them from a request body; `graders/grade.py`
grades with them. Unknown fields are refused (`extra="forbid"`)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Model):
    type: Literal["input_text"]
    text: str


class OutputText(_Model):
    type: Literal["output_text"]
    text: str


ContentPart = Union[InputText, OutputText]


class GraderMessage(_Model):
    """One input message of a model grader: content is a template string or text parts (images and
    audio are refused by name: the models here read text)."""

    role: Literal["user", "assistant", "system", "developer"]
    """OpenAI's roles; `developer` is rendered as `system` for the open models here."""
    content: Union[str, ContentPart, list[ContentPart]]
    """Text with templates, or text parts."""
    type: Literal["message"] | None = None

    def text(self) -> str:
        parts = self.content if isinstance(self.content, list) else [self.content]
        return "".join(p if isinstance(p, str) else p.text for p in parts)


class StringCheckGrader(_Model):
    type: Literal["string_check"]
    name: str
    input: str
    """The text being graded (a template)."""
    reference: str
    """The text it is checked against (a template)."""
    operation: Literal["eq", "ne", "like", "ilike"]
    """eq / ne: (in)equality; like: `reference` occurs in `input`; ilike: the same, ignoring case."""


Metric = Literal["cosine", "fuzzy_match", "bleu", "gleu", "meteor",
                 "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"]


class TextSimilarityGrader(_Model):
    type: Literal["text_similarity"]
    name: str
    input: str
    reference: str
    evaluation_metric: Metric
    pass_threshold: float | None = None
    """The score at or above which a grade passes (an eval's testing criterion requires it)."""


class PythonGrader(_Model):
    type: Literal["python"]
    name: str
    source: str
    """Python source defining `grade(sample, item) -> float`."""
    image_tag: str | None = None
    """OpenAI's runtime image; here one runtime, whatever the tag."""
    pass_threshold: float | None = None


class SamplingParams(_Model):
    max_completions_tokens: int | None = Field(default=None, ge=1)
    reasoning_effort: str | None = None
    """Accepted and ignored: the models here do not reason in hidden tokens."""
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)


class ScoreModelGrader(_Model):
    type: Literal["score_model"]
    name: str
    model: str
    """A base or one of the caller's ft: models (or checkpoints) that this service runs."""
    input: list[GraderMessage]
    range: list[float] | None = None
    """[low, high]; [0, 1] when absent. An answer outside it grades 0."""
    sampling_params: SamplingParams | None = None
    pass_threshold: float | None = None


class LabelModelGrader(_Model):
    type: Literal["label_model"]
    name: str
    model: str
    input: list[GraderMessage]
    labels: list[str]
    passing_labels: list[str]
    """A subset of `labels`; an answer with one of these passes (score 1)."""


SimpleGrader = Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, ScoreModelGrader, LabelModelGrader]


class MultiGrader(_Model):
    type: Literal["multi"]
    name: str
    graders: dict[str, SimpleGrader]
    """The graders by the names `calculate_output` reads. OpenAI's API takes this map; the SDK's type
    also allows one grader, which is read as {its name: it}."""
    calculate_output: str
    """An expression over the graders' names: + - * / ^, parentheses, min max abs floor ceil exp sqrt log."""


Grader = Union[SimpleGrader, MultiGrader]
MODEL_GRADERS = (ScoreModelGrader, LabelModelGrader)
TYPES: dict[str, type[BaseModel]] = {
    "string_check": StringCheckGrader, "text_similarity": TextSimilarityGrader, "python": PythonGrader,
    "score_model": ScoreModelGrader, "label_model": LabelModelGrader, "multi": MultiGrader,
}
