"""Long sequences and large vocabularies: chunked loss, chunked attention.

`tfmemopt.Model(..., chunked_loss=True, attention="chunked")` and
`tfmemopt.Model.wrap(model, chunked_loss=True, attention="chunked")` take
over the language-model head and the attention layers of a model the user
did not write (`enable_long_sequences`); the two functions underneath can
be called directly.
"""

from tfmemopt.longseq._attention import dot_product_attention
from tfmemopt.longseq._linear_cross_entropy import linear_cross_entropy
from tfmemopt.longseq._takeover import LongSequenceReport
from tfmemopt.longseq._takeover import disable_long_sequences
from tfmemopt.longseq._takeover import enable_long_sequences

__all__ = [
    "LongSequenceReport",
    "disable_long_sequences",
    "dot_product_attention",
    "enable_long_sequences",
    "linear_cross_entropy",
]
