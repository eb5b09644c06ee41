"""Collate functions for a ``DataLoader`` fed by a budget sampler: padded and padding-free.

* :func:`pad_collate`, :func:`make_pad_collate`, :class:`PaddedBatch` (``_pad``): pad each
  sequence field to the batch's longest; tuples, dicts, tensors or arrays.
* :func:`make_hf_collate` (``_hf``): dict samples padded per field with Hugging Face's
  conventions (pad id, ``-100`` labels, ``attention_mask``) -- the dict a transformers model takes.
* :func:`varlen_collate`, :func:`make_varlen_collate` (``_varlen``): padding-free batches, the
  samples concatenated into one ``(1, T)`` row with FlashAttention's boundaries.
* :func:`check_budget`, :class:`BudgetCheckedCollate` (``_budget``): a collate function that
  measures each batch it returns and raises at the first one over the sampler's budget.
* :func:`block_causal_mask`, :func:`document_block_mask` (``_masks``): attention masks that keep
  the samples of a padding-free row apart.
* :func:`pick_shape` (``_shapes``): the allowed (rows, length) a batch is padded to, so a
  compiled model sees a bounded number of shapes.

>>> import numpy as np
>>> batch = pad_collate([np.array([1, 2, 3]), np.array([4])])
>>> batch.values.tolist(), batch.lengths.tolist(), batch.mask.tolist()
([[1, 2, 3], [4, 0, 0]], [3, 1], [[True, True, True], [True, False, False]])
"""

from fitbatch.collate._budget import BudgetCheckedCollate, check_budget
from fitbatch.collate._hf import make_hf_collate
from fitbatch.collate._masks import block_causal_mask, document_block_mask
from fitbatch.collate._pad import PaddedBatch, make_pad_collate, pad_collate
from fitbatch.collate._shapes import pick_shape
from fitbatch.collate._varlen import make_varlen_collate, varlen_collate

__all__ = [
    "BudgetCheckedCollate",
    "PaddedBatch",
    "block_causal_mask",
    "check_budget",
    "document_block_mask",
    "make_hf_collate",
    "make_pad_collate",
    "make_varlen_collate",
    "pad_collate",
    "pick_shape",
    "varlen_collate",
]
