"""OpenAI's graders, one package for the grader endpoints, evals and reinforcement jobs: typed
graders (`models`), `validate` (a request body -> a grader, or the refusal naming its path),
`grade` / `grade_many` (-> `Grade(score, passed, details)`). Pure: no Ray, no HTTP, no storage;
a model grader's model and the python sandbox's limits come in through `Runtime`."""

from graders.grade import Grade, Runtime, grade, grade_many
from graders.model_graders import ModelAnswer, ModelCall, ModelRequest
from graders.models import Grader
from graders.templates import Scope, sample_namespace
from graders.validate import Rules, validate

__all__ = ["Grade", "Grader", "ModelAnswer", "ModelCall", "ModelRequest", "Rules", "Runtime", "Scope", "grade",
           "grade_many", "sample_namespace", "validate"]
