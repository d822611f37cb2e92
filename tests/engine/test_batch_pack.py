"""The host's packing of a step's inputs (engine/batch.py), checked without a device step:
every prompt token lands in its replica's block at its position, each completing chunk names
its last row, and padding points nowhere (slot N / D, dropped by the scatter)."""

from __future__ import annotations

import numpy as np

from lightspec_jax import SamplingParams
from lightspec_jax.engine.batch import MAX_STOP_IDS, PrefillInputs, SlotRows
from lightspec_jax.engine.scheduler import PrefillChunk
from lightspec_jax.request import Request


def request(slot: int, prompt: list[int], **params) -> Request:
    return Request(request_id=f"r{slot}", prompt_token_ids=prompt,
                   params=SamplingParams(**params), seed=7 + slot, stop_ids=frozenset({3, 1}),
                   allowance=11, slot=slot)


def test_prefill_rows_go_to_their_replicas_block():
    # 8 slots over 2 replicas: slots 0-3 are replica 0's, 4-7 replica 1's (local 0-3).
    a, b, c = (request(1, list(range(10, 16))), request(6, list(range(20, 23))),
               request(4, list(range(30, 34))))
    chunks = (PrefillChunk(a, start=2, length=4),  # completes a (prompt of 6)
              PrefillChunk(b, start=0, length=3),  # completes b
              PrefillChunk(c, start=0, length=2))  # c's first half
    need = PrefillInputs.rows_needed(chunks, 8, replicas=2)
    assert need == 2 * 5  # replica 1 holds 3 + 2 rows, the busiest
    inputs, where = PrefillInputs.pack(chunks, 12, 8, replicas=2)  # a bucket above the need
    width = 6
    # Replica 0's block: a's chunk, then padding (slot 4 = its N / D).
    np.testing.assert_array_equal(inputs.row_slot[:width], [1, 1, 1, 1, 4, 4])
    np.testing.assert_array_equal(inputs.row_pos[:4], [2, 3, 4, 5])
    np.testing.assert_array_equal(inputs.row_token[:4], [12, 13, 14, 15])
    np.testing.assert_array_equal(inputs.row_next_token[:4], [13, 14, 15, 0])  # none past the end
    # Replica 1's block: b (local slot 2), then c (local slot 0), then padding.
    np.testing.assert_array_equal(inputs.row_slot[width:], [2, 2, 2, 0, 0, 4])
    np.testing.assert_array_equal(inputs.row_token[width:width + 5], [20, 21, 22, 30, 31])
    np.testing.assert_array_equal(inputs.row_next_token[width + 3:width + 5], [31, 32])
    # Two prompts complete: a's last row (block row 3), b's (block row 2); c does not.
    samples = len(inputs.sample_row) // 2
    np.testing.assert_array_equal(where, [0, samples])
    assert inputs.sample_row[0] == 3 and inputs.sample_slot[0] == 1
    assert inputs.sample_row[samples] == 2 and inputs.sample_slot[samples] == 2
    padding = np.setdiff1d(np.arange(len(inputs.sample_slot)), where)
    assert (inputs.sample_slot[padding] == 4).all()


def test_one_replica_packs_chunks_back_to_back():
    a, b = request(0, [5, 6, 7]), request(2, [8, 9])
    chunks = (PrefillChunk(a, start=0, length=3), PrefillChunk(b, start=1, length=1))
    assert PrefillInputs.rows_needed(chunks, 4) == 4
    inputs, where = PrefillInputs.pack(chunks, 4, 4)
    np.testing.assert_array_equal(inputs.row_slot, [0, 0, 0, 2])
    np.testing.assert_array_equal(inputs.row_pos, [0, 1, 2, 1])
    np.testing.assert_array_equal(inputs.sample_row[where], [2, 3])
    np.testing.assert_array_equal(inputs.sample_slot[where], [0, 2])


def test_slot_rows_carry_the_admitted_requests_values_and_pad_past_the_slots():
    admitted = request(2, [1, 2], temperature=0.7, top_k=5, top_p=0.9)
    rows = SlotRows.pack(((2, admitted), (0, None)), 4, num_slots=8)
    np.testing.assert_array_equal(rows.slot, [2, 0, 8, 8])  # padding: slot N, dropped
    assert np.isclose(rows.temperature[0], 0.7) and rows.top_k[0] == 5
    assert np.isclose(rows.top_p[0], 0.9) and rows.seed[0] == 9 and rows.remaining[0] == 11
    np.testing.assert_array_equal(rows.stop_ids[0, :3], [1, 3, -1])
    assert rows.stop_ids.shape == (4, MAX_STOP_IDS)
    # A slot an abort left keeps the defaults: greedy, no allowance.
    assert rows.temperature[1] == 0 and rows.remaining[1] == 0 and rows.top_p[1] == 1
