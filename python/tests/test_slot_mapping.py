"""rope's slot-mapping converters from Python: FlashInfer's two forms and flash-attn's block table on
hand-worked batches (expected slots worked out in the comments), NumPy, lists and PyTorch tensors of any
integer type, a caller's ``out`` with padding, errors naming the array; on a GPU, PyTorch CUDA tensors
against the host's result (skipped, with the reason, elsewhere)."""

import numpy as np
import pytest

import rope

# page_size 4, pages 10. Request 0: pages 7, 2, last page holds 3 (sequence 7 tokens); request 1:
# page 5, holds 1 (sequence 1); request 2: pages 0, 9, 4, last full (sequence 12); request 3: nothing.
KV_INDPTR = [0, 2, 3, 6, 6]
KV_INDICES = [7, 2, 5, 0, 9, 4]
KV_LAST_PAGE_LEN = [3, 1, 4, 0]
APPEND_INDPTR = [0, 2, 3, 6, 6]
# Request 0 appends positions 5, 6 (page 2, offsets 1, 2); request 1 position 0 (page 5); request 2
# positions 9, 10, 11 (page 4, offsets 1, 2, 3).
APPEND_SLOTS = [9, 10, 20, 17, 18, 19]


def test_flashinfer_indptr_numpy_and_lists():
    got = rope.slot_mapping_from_flashinfer_indptr(np.array(APPEND_INDPTR, np.int32), KV_INDPTR,
                                                   np.array(KV_INDICES, np.int32), KV_LAST_PAGE_LEN,
                                                   page_size=4, pages=10)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    assert got.tolist() == APPEND_SLOTS


def test_flashinfer_indptr_out_with_padding():
    out = np.full(8, 12345, np.int64)
    result = rope.slot_mapping_from_flashinfer_indptr(APPEND_INDPTR, KV_INDPTR, KV_INDICES, KV_LAST_PAGE_LEN,
                                                      page_size=4, pages=10, out=out)
    assert result is out
    assert out.tolist() == APPEND_SLOTS + [-1, -1]  # tokens past append_indptr[-1] = 6: padding


def test_flashinfer_positions_padding():
    # (2, 0): page 0 -> 0. (-1, 99): padding. (0, 4): page 2, offset 0 -> 8. (0, 7): page 2, offset 3 -> 11.
    # (1, 0): page 5 -> 20.
    got = rope.slot_mapping_from_flashinfer_positions([2, -1, 0, 0, 1], [0, 99, 4, 7, 0], KV_INDPTR, KV_INDICES,
                                                      page_size=4, pages=10)
    assert got.tolist() == [0, -1, 8, 11, 20]


def test_block_table_sliced_rows():
    # A wider table sliced to 3 columns (rows 5 apart; 99 never read). Request 0 has 6 tokens cached:
    # positions 6, 7 -> block 1 = page 5, offsets 2, 3 -> 22, 23; 8 -> block 2 = page 3 -> 12. Request 1:
    # positions 0, 1 -> page 2 -> 8, 9.
    wide = np.array([[6, 5, 3, 99, 99], [2, 7, 0, 99, 99]])
    got = rope.slot_mapping_from_block_table(wide[:, :3], np.array([6, 0], np.int32), [0, 3, 5], page_size=4, pages=8)
    assert got.tolist() == [22, 23, 12, 8, 9]


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    got = rope.slot_mapping_from_block_table(torch.tensor([[6, 5, 3], [2, 7, 0]], dtype=torch.int32),
                                             torch.tensor([6, 0]), torch.tensor([0, 3, 5]), page_size=4, pages=8)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    assert got.tolist() == [22, 23, 12, 8, 9]


@pytest.mark.parametrize("call, needle", [
    (lambda: rope.slot_mapping_from_flashinfer_indptr(APPEND_INDPTR, KV_INDPTR, [7, 2, 5, 0, 9, 10], KV_LAST_PAGE_LEN,
                                                      page_size=4, pages=10), "kv_indices[5] = 10"),
    (lambda: rope.slot_mapping_from_flashinfer_indptr(APPEND_INDPTR, KV_INDPTR, KV_INDICES, [3, 1, 4],
                                                      page_size=4, pages=10), "kv_last_page_len.shape[0] = 3"),
    (lambda: rope.slot_mapping_from_flashinfer_indptr([0, 2, 4, 6, 6], KV_INDPTR, KV_INDICES, KV_LAST_PAGE_LEN,
                                                      page_size=4, pages=10), "sequence length 1"),
    (lambda: rope.slot_mapping_from_flashinfer_positions([0, 4], [0, 0], KV_INDPTR, KV_INDICES, page_size=4,
                                                         pages=10), "batch_indices[1] = 4"),
    (lambda: rope.slot_mapping_from_flashinfer_positions([0, 1], [0, 4], KV_INDPTR, KV_INDICES, page_size=4,
                                                         pages=10), "positions[1] = 4"),
    (lambda: rope.slot_mapping_from_flashinfer_positions([0, 1], [0.0, 1.0], KV_INDPTR, KV_INDICES, page_size=4,
                                                         pages=10), "positions = float64"),
    (lambda: rope.slot_mapping_from_block_table([[6, 5, 3]], [11], [0, 2], page_size=4, pages=8),
     "cache_seqlens[0] = 11"),
    (lambda: rope.slot_mapping_from_block_table([[6, 5, 3]], [0], [0, 2], page_size=0, pages=8), "page_size = 0"),
])
def test_bad_input_names_the_array_and_writes_nothing(call, needle):
    with pytest.raises(rope.Error) as error:
        call()
    assert needle in str(error.value)


def test_bad_input_leaves_out_untouched():
    out = np.full(5, 12345, np.int64)
    with pytest.raises(rope.Error, match=r"block_table\[1\]\[0\] = 8"):
        rope.slot_mapping_from_block_table([[6, 5, 3], [8, 7, 0]], [6, 0], [0, 3, 5], page_size=4, pages=8, out=out)
    assert out.tolist() == [12345] * 5


def test_cuda_tensors_match_the_host():
    torch = pytest.importorskip("torch", reason="the CUDA case uses PyTorch tensors")
    cuda = [b for b in rope.list_backends() if b.device == "cuda"]
    if not any(b.available for b in cuda):
        pytest.skip("no CUDA backend available here: " + cuda[0].reason)
    rng = np.random.default_rng()
    batch, page_size, pages, blocks = 16, 16, 1024, 8
    table = rng.permutation(pages)[:batch * blocks].reshape(batch, blocks)
    cached = rng.integers(0, blocks * page_size - 8, batch)
    cu = np.concatenate([[0], np.cumsum(rng.integers(0, 9, batch))])
    host = rope.slot_mapping_from_block_table(table, cached, cu, page_size=page_size, pages=pages)
    out = torch.full((int(cu[-1]) + 2,), 777, dtype=torch.int64, device="cuda")
    rope.slot_mapping_from_block_table(torch.from_numpy(table).cuda(), torch.from_numpy(cached).cuda(),
                                       torch.from_numpy(cu).cuda(), page_size=page_size, pages=pages, out=out)
    assert out.cpu().tolist() == host.tolist() + [-1, -1]
    # A page index out of range: the host refuses it, the GPU writes -1 for the tokens that read it.
    table[0, :] = pages
    rope.slot_mapping_from_block_table(torch.from_numpy(table).cuda(), torch.from_numpy(cached).cuda(),
                                       torch.from_numpy(cu).cuda(), page_size=page_size, pages=pages, out=out)
    assert out.cpu().tolist()[:int(cu[1])] == [-1] * int(cu[1])
    assert out.cpu().tolist()[int(cu[1]):int(cu[-1])] == host.tolist()[int(cu[1]):]
