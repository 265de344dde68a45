"""XLM-RoBERTa's position ids for packed sequences equal transformers'
``create_position_ids_from_input_ids`` of each sequence alone: a token equal to
``pad_token_id`` (1 here) takes position 1 and is not counted, the others count from 2."""

import jax.numpy as jnp
import numpy as np

from replicas.model.encoder import roberta_positions


def test_packed_positions_equal_transformers_per_sequence() -> None:
    from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEmbeddings

    # two rows; sequences [2 5 1 7 3], [2 1 1 3], then padding; [2 6 3], [2 1 8 1 9 3]
    tokens = np.array([[2, 5, 1, 7, 3, 2, 1, 1, 3, 0, 0], [2, 6, 3, 2, 1, 8, 1, 9, 3, 0, 0]])
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0], [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 0]])
    expected = np.array([[2, 3, 1, 4, 5, 2, 1, 1, 3], [2, 3, 4, 2, 1, 3, 1, 4, 5]])
    got = np.asarray(roberta_positions(jnp.asarray(tokens), jnp.asarray(positions), pad=1))
    np.testing.assert_array_equal(got[:, :9], expected)
    import torch

    for row, spans in ((0, [(0, 5), (5, 9)]), (1, [(0, 3), (3, 9)])):
        for start, end in spans:
            alone = torch.tensor(tokens[row : row + 1, start:end])
            hf = XLMRobertaEmbeddings.create_position_ids_from_input_ids(alone, 1)
            np.testing.assert_array_equal(got[row, start:end], hf[0].numpy())
