"""Response-length prediction for EcoServe: a synthetic prompt corpus, features, a ridge model."""

from serving.predictor.corpus import CATEGORIES, PromptSample, make_corpus
from serving.predictor.model import DEFAULT_BUCKET_EDGES, LengthPredictor, PredictorReport, bucket_of
from serving.predictor.workload import PromptWorkload, prompt_workload, train_predictor

__all__ = [
    "CATEGORIES",
    "DEFAULT_BUCKET_EDGES",
    "LengthPredictor",
    "PredictorReport",
    "PromptSample",
    "PromptWorkload",
    "bucket_of",
    "make_corpus",
    "prompt_workload",
    "train_predictor",
]
