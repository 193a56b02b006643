"""Long sequences and large vocabularies: chunked loss, chunked attention.

`tfmemopt.Model(..., chunked_loss=True, attention="chunked")` and
`tfmemopt.Model.wrap(model, chunked_loss=True, attention="chunked")` take
over the language-model head and the attention layers of a model the user
did not write (`enable_long_sequences`); the two functions underneath can
be called directly.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.longseq._attention import dot_product_attention
from tfmemopt.longseq._enable import LongSequenceReport
from tfmemopt.longseq._enable import check_compiled as check_compiled
from tfmemopt.longseq._enable import check_options as check_options
from tfmemopt.longseq._enable import disable_long_sequences
from tfmemopt.longseq._enable import enable_long_sequences
from tfmemopt.longseq._enable import report_of as report_of
from tfmemopt.longseq._head import Forward as Forward
from tfmemopt.longseq._head import head_candidates as head_candidates
from tfmemopt.longseq._head import training_forward as training_forward
from tfmemopt.longseq._hub_attention import is_hub_attention as is_hub_attention
from tfmemopt.longseq._linear_cross_entropy import linear_cross_entropy

__all__ = [
    "LongSequenceReport",
    "disable_long_sequences",
    "dot_product_attention",
    "enable_long_sequences",
    "linear_cross_entropy",
]
