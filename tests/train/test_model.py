"""GPT-2 with document-isolated attention, on real packed batches from the loader."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import real_paragraphs  # noqa: E402
from tests.loader.tables import token_table  # noqa: E402
from tokenloom.loader import PackedDataset  # noqa: E402
from tokenloom.train import GPT, GPTConfig, document_mask  # noqa: E402

L = 64


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    texts = [t[:18] for t in real_paragraphs(30)]  # short documents: several per block
    uri = token_table(tmp_path_factory.mktemp("model"), texts)
    return next(iter(PackedDataset(uri, seq_len=L, global_batch=2, seed=0)))


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=258, block_size=L, n_layer=2, n_head=2, n_embd=32)).double()


def test_document_mask_is_block_diagonal_and_causal():
    doc = torch.tensor([[0, 0, 1, 1, 1, -1]])
    m = document_mask(doc)[0, 0]
    assert m[1, 0] and not m[2, 1] and m[4, 2] and not m[2, 3]
    assert m[5].tolist() == [False] * 5 + [True]  # padding sees only itself


def test_changing_one_document_leaves_the_others_untouched(batch):
    model = _model().eval()
    ids, pos, doc = batch["input_ids"], batch["position_ids"], batch["doc_ids"]
    assert int(doc[0].max()) >= 2, "the block must hold several documents"
    target = 1  # change every token of the block's second document
    changed = ids.clone()
    sel = doc == target
    sel[1:] = False
    changed[sel] = (changed[sel] + 7) % 256
    with torch.no_grad():
        a, _ = model(ids, position_ids=pos, doc_ids=doc)
        b, _ = model(changed, position_ids=pos, doc_ids=doc)
        ca, _ = model(ids, attention="causal")
        cb, _ = model(changed, attention="causal")
    others = (doc[0] != target) & (doc[0] >= 0)
    assert torch.equal(a[0, others], b[0, others])  # isolated: bit-identical
    assert not torch.equal(a[0, sel[0]], b[0, sel[0]])
    later = others & (torch.arange(L) > torch.nonzero(sel[0])[-1])
    assert not torch.allclose(ca[0, later], cb[0, later])  # plain causal attention leaks


def test_loss_ignores_cross_document_targets_and_trains(batch):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        _, loss = model(
            batch["input_ids"],
            position_ids=batch["position_ids"],
            doc_ids=batch["doc_ids"],
            labels=batch["labels"],
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert GPT.preset("tiny", vocab_size=258, block_size=L).num_params() > 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_mask_equals_the_sdpa_mask(batch):
    model = _model().eval()
    kw = dict(position_ids=batch["position_ids"], doc_ids=batch["doc_ids"])
    with torch.no_grad():
        dense, _ = model(batch["input_ids"], kernel="sdpa", **kw)
        flex, _ = model(batch["input_ids"], kernel="flex", **kw)
    real = batch["doc_ids"] >= 0  # padding may differ: it carries no loss
    assert torch.allclose(dense[real], flex[real], atol=1e-10)


def test_mfu_counts_flops_like_palm():
    from tokenloom.train.flops import flops_per_token, mfu, peak_flops

    model = GPT.preset("small", block_size=1024)
    per_token = flops_per_token(model, 1024)
    n = model.num_params() - model.wpe.weight.numel()
    assert per_token == 6 * n + 12 * 12 * 768 * 1024
    assert 123e6 < n < 125e6  # GPT-2 small: 124M without the position table
    assert peak_flops(torch.device("cpu")) is None and mfu(1e5, per_token, None) is None
    assert mfu(1e5, per_token, 1e15) == pytest.approx(1e5 * per_token / 1e15)


def _random_doc_ids(B: int, T: int, longest: int, gen: torch.Generator) -> torch.Tensor:
    """Packed-block ``doc_ids``: runs 0, 1, 2, ... of random lengths, then some padding."""
    out = torch.full((B, T), -1)
    for b in range(B):
        end = T - int(torch.randint(0, 9, (1,), generator=gen))
        p = d = 0
        while p < end:
            n = min(int(torch.randint(1, longest, (1,), generator=gen)), end - p)
            out[b, p : p + n] = d
            p, d = p + n, d + 1
    return out


@pytest.mark.parametrize(("B", "T", "longest"), [(2, 64, 20), (3, 300, 130), (1, 700, 690)])
def test_document_segments_equal_the_dense_mask_forward_and_backward(B, T, longest):
    from tokenloom.train.segments import DocumentSegments

    gen = torch.Generator().manual_seed(T)
    doc = _random_doc_ids(B, T, longest, gen)
    q, k, v = (torch.randn(B, 3, T, 8, generator=gen, requires_grad=True) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(doc))
    grads_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    got = DocumentSegments(doc).attend(q, k, v)
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    assert float((got - ref).detach().abs().max()) < 1e-5
    assert all(float((a - b).abs().max()) < 1e-5 for a, b in zip(grads, grads_ref, strict=True))


def test_the_model_on_document_segments_equals_the_dense_mask(batch):
    from tokenloom.train.segments import DocumentSegments

    model = _model()
    ids, pos, doc = batch["input_ids"], batch["position_ids"], batch["doc_ids"]
    dense, _ = model(ids, position_ids=pos, mask=document_mask(doc))
    runs, _ = model(ids, position_ids=pos, mask=DocumentSegments(doc))
    assert float((dense - runs).abs().max()) < 1e-9  # float64 model


def test_long_blocks_attend_without_a_dense_mask():
    from tokenloom.train.model import DENSE_MASK_MAX, attention_mask
    from tokenloom.train.segments import DocumentSegments

    doc = torch.zeros(1, DENSE_MASK_MAX + 1, dtype=torch.long)
    assert isinstance(attention_mask(doc, attention="document", kernel="sdpa"), DocumentSegments)
    split = torch.tensor([[0, 0, 1, 1, 0, 0]])  # one document in two runs: not a packed block
    with pytest.raises(ValueError, match="two separate runs"):
        DocumentSegments(split)
