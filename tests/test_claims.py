"""The study notes' claims (docs/claims.md), each asserting what PyTorch really does; `meta` stands in for CUDA."""

import copy
import warnings
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_steps import BCE, adam, gradients_at_each_update
from torch import nn

from gan.core.steps import d_step, frozen, g_step, release_grads


def records_warnings(fn):
    """Run fn(); return its result and the messages of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


def test_note000_no_grad_is_not_a_freeze(tiny_gan):
    G, D = tiny_gan
    fake = G(torch.randn(4, 16))
    with torch.no_grad():
        loss = BCE.g(D(fake))
        assert all(p.requires_grad for p in D.parameters())  # nothing was frozen
    assert loss.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        loss.backward()  # nothing to backpropagate: G cannot learn through a no_grad D


def test_note000_devices_norms_and_float32():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    made = torch.zeros(1, device=device).device  # the string is taken; a GPU's tensor gets the current index
    index = torch.cuda.current_device() if device == "cuda" else None
    assert made.type == device and made == torch.device(device, index)
    assert (made == torch.device(device)) == (device == "cpu")  # on a GPU cuda:0 != cuda: compare .type
    assert torch.zeros(1).to("meta").device == torch.device("meta")
    x = torch.randn(3, requires_grad=True)
    assert x.cpu() is x and x.to("cpu") is x
    assert x.cpu().grad_fn is None  # same object, a leaf: no edge on the CPU
    assert x.cpu().detach().data_ptr() == x.detach().cpu().data_ptr() == x.data_ptr()
    assert type(x.to("meta").grad_fn).__name__ == "ToCopyBackward0"  # a real copy records an edge
    assert x.detach().to("meta").grad_fn is None  # detach first: nothing recorded
    m = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    assert torch.equal(m.norm(dim=-1), torch.tensor([5.0, 2.0, 1.0]))
    assert m.norm(dim=-1, keepdim=True).shape == (3, 1) and m.norm(dim=-1, keepdim=False).shape == (3,)
    assert m.norm().shape == () and m.norm().item() == pytest.approx(30**0.5)
    assert torch.tensor(16777217, dtype=torch.float32).item() == 16777216.0  # float64 holds 16777217
    assert torch.tensor(16777217, dtype=torch.float64).item() == 16777217.0
    assert torch.finfo(torch.float32).eps == 2.0**-23  # 23 stored bits + the implicit one


def test_note000_detach_and_numpy_share_memory():
    x = torch.randn(3, requires_grad=True)
    y = x.exp()  # exp saves its output for backward
    d = y.detach()
    assert d is not y and not d.requires_grad and d.data_ptr() == y.data_ptr()
    d.zero_()  # write through the detached tensor
    assert torch.equal(y, torch.zeros(3))
    pytest.raises(RuntimeError, lambda: y.sum().backward()).match("modified by an inplace operation")
    again = x.detach().requires_grad_()
    assert again.requires_grad and again.is_leaf
    t = torch.zeros(3)
    a = t.numpy()
    t[0], a[1] = 1.0, 2.0
    assert a.tolist() == t.tolist() == [1.0, 2.0, 0.0]
    with pytest.raises(TypeError, match="can't convert meta device type tensor to numpy"):
        torch.zeros(2, device="meta").numpy()
    x = torch.ones(2, requires_grad=True)
    pytest.raises(RuntimeError, lambda: x.numpy()).match(r"Can't call numpy\(\) on Tensor that requires grad")
    forced = x.numpy(force=True)
    forced[0] = 5.0
    assert x.tolist() == [5.0, 1.0]  # written through, behind autograd's back
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.nn.Linear(2, 2)(torch.zeros(1, 2))
    assert out.dtype == torch.bfloat16
    pytest.raises(TypeError, lambda: out.detach().numpy()).match("BFloat16")
    assert out.detach().float().cpu().numpy().dtype == np.float32
    t = torch.zeros(2)
    copied = t.numpy().astype("float32")  # t.numpy() is float32 already: astype only copies
    assert t.numpy().dtype == np.float32
    t[0] = 5.0
    assert copied[0] == 0.0  # a copy: the tensor's write does not reach it
    assert torch.zeros(2, dtype=torch.float64).numpy().astype("float32").dtype == np.float32


def test_note001_devices_and_leaves():
    on_device = torch.ones(2, device="meta")
    with pytest.raises(RuntimeError, match="Tensor on device cpu is not on the expected device meta"):
        on_device + torch.ones(2)
    with pytest.raises(RuntimeError, match="device"):
        on_device + torch.ones(1)  # one element but 1-dim: not the exception
    assert (on_device + torch.tensor(1.0)).device.type == "meta"  # 0-dim CPU: allowed
    b = torch.ones(2)
    b.to("meta")
    assert b.device.type == "cpu"
    module = nn.Linear(2, 2)
    assert module.to("meta") is module and module.weight.device.type == "meta"
    direct = torch.tensor([1.0, 2.0], requires_grad=True, device="meta")
    assert direct.is_leaf and direct.grad_fn is None
    assert "requires_grad=True" in repr(direct) and "grad_fn" not in repr(direct)
    cpu = torch.tensor([1.0, 2.0], requires_grad=True)
    moved = cpu.to("meta")
    assert not moved.is_leaf and type(moved.grad_fn).__name__ == "ToCopyBackward0"
    moved = cpu.to(torch.float64)  # the same ToCopy node; backward runs on the CPU
    moved.sum().backward()
    assert cpu.grad is not None
    grad, messages = records_warnings(lambda: moved.grad)
    assert grad is None and any("not a leaf" in m for m in messages)
    x, y = torch.randn(3), torch.randn(3)
    assert (x * y).grad_fn is None  # plain data: no graph even with grad mode on
    layer = nn.Linear(3, 1)
    out = layer(x)
    assert out.grad_fn is not None and layer.weight.grad is None  # a graph, but no stored gradient
    with torch.no_grad():
        assert layer(x).grad_fn is None


def test_note001_numpy_and_requires_grad():
    w = torch.ones(2, requires_grad=True)
    pytest.raises(RuntimeError, lambda: w.numpy()).match(r"requires grad\. Use tensor.detach\(\).numpy\(\) instead")
    assert w.detach().numpy().tolist() == [1.0, 1.0]
    with torch.no_grad():
        a = w.numpy()
    assert w.requires_grad
    with torch.no_grad():
        w.add_(1.0)
    assert a.tolist() == [2.0, 2.0]  # the same memory as the parameter
    plain = torch.rand(3, 4)
    assert plain.numpy().shape == (3, 4)  # the note's x_t converts without no_grad
    with torch.no_grad(), pytest.raises(TypeError):
        np.ones(2) + torch.ones(2)  # not interchangeable in an expression, no_grad or not
    array = np.ones(2)  # float64
    result, _ = records_warnings(lambda: torch.ones(2) + array)  # NumPy 2 warns about __array_wrap__
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float64
    pytest.raises(TypeError, lambda: array + torch.ones(2))
    pytest.raises(RuntimeError, lambda: torch.rand(3, 4) @ torch.from_numpy(np.ones((4, 2)))).match("same dtype")
    ok = torch.rand(3, 4) @ torch.from_numpy(np.ones((4, 2), dtype=np.float32))  # the note's float32 case
    assert ok.shape == (3, 2)


def test_note002_backward_and_grad():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(torch.ones(3))  # explicit gradient: fine
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    (x * 2).sum().reshape(1, 1).backward()  # a 1x1 output also gets the implicit 1
    assert torch.equal(x.grad, torch.full((3,), 4.0))
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    assert w.grad is None
    (w * 3).sum().backward()
    assert w.grad.tolist() == [3.0, 3.0]
    (w * w).sum().backward()  # a second graph: its gradient is added, not assigned
    assert w.grad.tolist() == [5.0, 7.0]
    x = torch.randn(3, requires_grad=True)
    kept, dropped = x * 2, x * 3
    kept.retain_grad()
    (kept.sum() + dropped.sum()).backward()
    assert kept.grad.tolist() == [1.0, 1.0, 1.0]
    grad, messages = records_warnings(lambda: dropped.grad)
    assert grad is None and any("retain_grad" in m for m in messages)
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        torch.ones(2).retain_grad()
    x = torch.randn(3, requires_grad=True)
    y = (x + 1).sum()
    y.backward()
    y.backward()  # nothing was saved, nothing was freed
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    y = (x * x).sum()
    y.backward()
    pytest.raises(RuntimeError, lambda: y.backward()).match("Trying to backward through the graph a second time")
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()  # kept: works
    for value, expected in ((1.0, 9.0), (2.0, 36.0)):  # the upstream 3 times z'(x) = 3 x^2
        x = torch.tensor(value, requires_grad=True)
        (x**3).backward(torch.tensor(3.0))
        assert x.grad.item() == expected
    W_h, W_x = torch.randn(20, 20, requires_grad=True), torch.randn(20, 10, requires_grad=True)
    x, prev_h = torch.randn(1, 10), torch.randn(1, 20)
    pytest.raises(RuntimeError, lambda: torch.mm(W_h, prev_h)).match("cannot be multiplied")
    next_h = (torch.mm(W_h, prev_h.t()) + torch.mm(W_x, x.t())).tanh()
    assert next_h.shape == (20, 1)
    next_h.sum().backward()
    assert W_h.grad.shape == (20, 20) and W_x.grad.shape == (20, 10) and x.grad is None and prev_h.grad is None


def test_note002_no_grad_saves_no_tensors_and_cannot_backprop():
    x, saved = torch.randn(64, requires_grad=True), []

    def forward():
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            hidden = x.exp()
            alive, out = weakref.ref(hidden), hidden.sin()
            del hidden
            return out, alive

    out, alive = forward()
    assert len(saved) == 2 and alive() is not None  # exp's output kept alive by the graph
    saved.clear()
    with torch.no_grad():
        out_no_grad, alive = forward()
    assert saved == [] and alive() is None  # nothing saved, the intermediate is gone
    assert torch.equal(out.detach(), out_no_grad)  # the same numbers
    pytest.raises(RuntimeError, lambda: out_no_grad.sum().backward()).match("does not require grad")
    layer, tokens = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval(), torch.randn(2, 5, 16)
    with torch.autograd.profiler.profile() as with_grad:
        expected = layer(tokens)
    with torch.no_grad(), torch.autograd.profiler.profile() as without_grad:
        fast = layer(tokens)
    fused = "aten::_transformer_encoder_layer_fwd"
    assert fused in {e.name for e in without_grad.function_events}
    assert fused not in {e.name for e in with_grad.function_events}
    torch.testing.assert_close(fast, expected.detach())  # close, not necessarily equal: other kernels


def test_note002_eval_changes_batchnorm_and_dropout_not_autograd(tiny_gan):
    G, _ = tiny_gan
    z = torch.randn(8, 16)
    train_out = G(z)
    G.eval()
    bn = next(m for m in G.modules() if isinstance(m, nn.BatchNorm2d))
    stats, eval_out = bn.running_mean.clone(), G(z)
    assert not torch.allclose(train_out, eval_out)  # batch statistics vs running statistics
    assert torch.equal(stats, bn.running_mean)  # eval does not update the running statistics
    assert eval_out.grad_fn is not None  # ... and still builds a graph
    eval_out.sum().backward()
    assert all(p.grad is not None for p in G.parameters())
    drop, ones = nn.Dropout(0.5), torch.ones(1000)
    assert (drop(ones) == 0).any() and torch.equal(drop.eval()(ones), ones)


def test_note002_detach_makes_a_leaf_and_stops_at_it(tiny_gan):
    G, D = tiny_gan
    fake = G(torch.randn(4, 16))
    x = fake.detach()
    assert x.is_leaf and not x.requires_grad and not fake.is_leaf
    BCE.d(D(torch.randn(4, 1, 16, 16)), D(x)).backward()
    assert all(p.grad is not None for p in D.parameters()) and all(p.grad is None for p in G.parameters())


def test_note002_leaves_and_requires_grad():
    a, b = torch.randn(2), torch.randn(2)
    assert a.is_leaf and (a * b + 1).is_leaf
    w = torch.randn(2, requires_grad=True)
    with torch.no_grad():
        assert (w * 2).is_leaf
    assert w.detach().is_leaf and nn.Linear(2, 2).weight.is_leaf
    revived = (torch.randn(2, requires_grad=True) * 2).detach().requires_grad_()
    assert revived.is_leaf and revived.requires_grad and revived.grad_fn is None
    user_made = torch.randn(2, requires_grad=True).double()
    assert not user_made.is_leaf and user_made.grad_fn is not None
    assert not torch.randn(2).requires_grad and not torch.tensor([1.0]).requires_grad
    assert nn.Parameter(torch.randn(2)).requires_grad and all(p.requires_grad for p in nn.Conv2d(1, 1, 3).parameters())
    assert (torch.randn(2) * nn.Parameter(torch.randn(2))).requires_grad
    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0)
    c = a * b
    assert (a.grad, a.grad_fn, a.is_leaf, a.requires_grad) == (None, None, True, True)
    assert (b.grad_fn, b.is_leaf, b.requires_grad) == (None, True, False)
    assert c.item() == 6.0 and type(c.grad_fn).__name__ == "MulBackward0" and not c.is_leaf and c.requires_grad
    x = torch.tensor(1.0, requires_grad=True)
    assert (x * 2).requires_grad
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None and x.requires_grad
    y = x.detach()
    assert not y.requires_grad and bool(x.eq(y).all())
    assert (y * 2).grad_fn is None  # nothing after detach is tracked
    assert y.data_ptr() == x.data_ptr()


def test_note002_several_backwards():
    w, data = torch.randn(4, requires_grad=True), torch.randn(6, 4)
    for chunk in data.split(2):  # three mini-batches, three graphs, no retain_graph
        (chunk @ w).pow(2).sum().backward()
    full = torch.autograd.grad((data @ w).pow(2).sum(), w)[0]
    torch.testing.assert_close(w.grad, full)

    def build() -> tuple[nn.Module, nn.Module, nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        trunk = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        return trunk, nn.Linear(4, 1), nn.Linear(4, 1), torch.randn(8, 4)

    def losses(trunk, head_a, head_b, x) -> tuple[torch.Tensor, torch.Tensor]:
        shared = trunk(x)
        return head_a(shared).pow(2).mean(), head_b(shared).sin().mean()

    summed = build()
    loss_a, loss_b = losses(*summed)
    (loss_a + 0.5 * loss_b).backward()
    separate = build()
    loss_a, loss_b = losses(*separate)
    loss_a.backward(retain_graph=True)
    (0.5 * loss_b).backward()
    for one, other in zip(summed[:3], separate[:3]):  # trunk (shared) and both heads: the same .grad
        for p, q in zip(one.parameters(), other.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    trunk, head_a, head_b, x = build()
    loss_a, loss_b = losses(trunk, head_a, head_b, x)
    loss_a.backward(retain_graph=True)
    torch.optim.SGD(trunk.parameters(), lr=0.1).step()  # a step for loss_a alone, before loss_b's backward
    pytest.raises(RuntimeError, lambda: loss_b.backward()).match("modified by an inplace operation")


# The real d_step and g_step (or d_step's lines with one change) from the same G, D and batch; a step pre-hook reads
# the gradient each optimizer is about to use (the steps release .grad right after). test_walkthrough.py uses them too.


def gradient_of(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in module.parameters()]).clone()


@pytest.mark.parametrize("patch", ["none", "retain_graph", "second_G_forward", "dcgan_main"])
def test_note002_without_detach_a_gan_step_raises_and_retain_graph_only_hides_it(tiny_gan, patch):
    """none raises at the G step, this loop's and dcgan/main.py's; retain_graph=True or a second G(z) lets D's loss
    reach G's update; dcgan/main.py's order (netG.zero_grad() before the G step's backward) wipes it."""
    G, D = tiny_gan
    real, z = torch.rand(8, 1, 16, 16) * 2 - 1, torch.randn(8, 16)
    G_clean, D_clean = copy.deepcopy(G), copy.deepcopy(D)  # G's gradient at its first update by the real steps
    opt_clean, opt_g = adam(G_clean), adam(G)
    clean, seen = gradients_at_each_update(opt_clean), gradients_at_each_update(opt_g)
    fake = G_clean(z)
    _, real_features = d_step(D_clean, adam(D_clean), real, fake)
    assert all(p.grad is None for p in G_clean.parameters())  # the fix: D's backward stops at fake.detach()
    g_step(D_clean, G_clean, opt_clean, fake, real_features)
    fake = G(z)
    real_logits, real_features = D(real, with_features=True)  # d_step's lines with D(fake) for D(fake.detach())
    BCE.d(real_logits, D(fake)).backward(retain_graph=patch in ("retain_graph", "dcgan_main"))
    adam(D).step()
    release_grads(D)
    assert all(p.grad is not None for p in G.parameters())  # D's backward ran on through G
    from_d = gradient_of(G)  # D's loss, written into G's .grad
    if patch == "none":  # the error comes at the G step, this loop's or dcgan/main.py's errG.backward(): nothing silent
        for g_backward in (lambda: g_step(D, G, opt_g, fake, real_features), lambda: BCE.g(D(fake)).backward()):
            with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
                g_backward()
    elif patch == "dcgan_main":  # netG.zero_grad() just before the G step's backward
        G.zero_grad(set_to_none=True)
        with frozen(D):
            BCE.g(D(fake)).backward()
        torch.testing.assert_close(gradient_of(G), clean[0])
    else:  # the second G(z) makes the same images; the G step backpropagates its own graph, so nothing raises
        g_step(D, G, opt_g, fake if patch == "retain_graph" else G(z), real_features)
        torch.testing.assert_close(seen[0], clean[0] + from_d)  # G's update follows G's objective plus D's
        assert float((seen[0] - clean[0]).norm() / clean[0].norm()) > 0.1


def test_note002_requires_grad_false_freezes_part_of_a_model_and_true_on_an_input_trains_it(tiny_gan):
    G, D = tiny_gan
    with frozen(D):
        BCE.g(D(G(torch.randn(4, 16)))).backward()
    assert all(p.grad is None for p in D.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in G.parameters())
    D.eval()  # per-sample logits, so the step below moves each image's own score
    x = torch.randn(4, 1, 16, 16, requires_grad=True)
    with frozen(D):
        D(x).sum().backward()
        with torch.no_grad():
            stepped = x + 0.01 * x.grad.sign()
            assert (D(stepped) > D(x)).all()
    assert x.grad is not None


def test_note003_Tensor_and_tensor():
    assert isinstance(torch.Tensor, type) and not isinstance(torch.tensor, type)
    empty = torch.Tensor()
    assert empty.shape == (0,) and empty.dtype == torch.float32
    assert torch.Tensor([1, 2]).dtype == torch.float32 and torch.Tensor(torch.arange(3)).dtype == torch.int64
    assert torch.Tensor(3).shape == (3,) and torch.tensor(3).shape == () and torch.tensor(3).item() == 3
    # torch.Tensor(data) shares a float32 tensor's or array's memory and copies a float64 array or a list
    sources = [(torch.zeros(3), True), (np.zeros(3, dtype=np.float32), True), (np.zeros(3), False), ([0.0], False)]
    for data, shared in sources:
        made = torch.Tensor(data)
        data[0] = 7.0
        assert made is not data and made.dtype == torch.float32 and (made[0].item() == 7.0) == shared, type(data)
    pytest.raises(TypeError, lambda: torch.tensor()).match('missing 1 required positional arguments: "data"')
    assert torch.tensor([1, 2]).dtype == torch.int64 and torch.tensor([1.0]).dtype == torch.float32
    assert torch.tensor(np.zeros(1)).dtype == torch.float64
    t = torch.zeros(2)
    copy, messages = records_warnings(lambda: torch.tensor(t))
    t[0] = 1.0
    assert copy[0].item() == 0.0 and any("detach().clone()" in m for m in messages)
    array = np.zeros(2, dtype=np.float32)
    copied, shared = torch.tensor(array), torch.as_tensor(array)
    array[0] = 1.0
    assert copied[0].item() == 0.0 and shared[0].item() == 1.0


def test_note003_nn_F_and_products():
    logits, targets = torch.randn(8), torch.rand(8)
    module = nn.BCEWithLogitsLoss()
    assert isinstance(module, nn.Module) and not isinstance(F.binary_cross_entropy_with_logits, nn.Module)
    assert torch.equal(module(logits, targets), F.binary_cross_entropy_with_logits(logits, targets))
    weight = torch.tensor([1.0, 2.0, 3.0])
    logits, target = torch.randn(5, 3), torch.tensor([0, 1, 2, 2, 1])
    module = nn.CrossEntropyLoss(weight=weight)
    assert torch.equal(module(logits, target), F.cross_entropy(logits, target, weight=weight))
    assert "weight" in module.state_dict() and module.to(torch.float64).weight.dtype == torch.float64
    assert torch.dot(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])).item() == 11.0
    pytest.raises(RuntimeError, lambda: torch.dot(torch.ones(2, 2), torch.ones(2, 2))).match("1D tensors expected")
    pytest.raises(RuntimeError, lambda: torch.mm(torch.ones(2, 3, 4), torch.ones(4, 5))).match("self must be a matrix")
    pytest.raises(RuntimeError, lambda: torch.mm(torch.ones(3, 4), torch.ones(4))).match("mat2 must be a matrix")
    assert torch.bmm(torch.ones(2, 3, 4), torch.ones(2, 4, 5)).shape == (2, 3, 5)
    assert torch.matmul(torch.ones(3, 4), torch.ones(4)).shape == (3,)
    assert torch.matmul(torch.ones(2, 3, 4), torch.ones(4, 5)).shape == (2, 3, 5)
    assert torch.matmul(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 6)).shape == (2, 5, 3, 6)


def test_note003_views():
    a = torch.arange(6.0).view(2, 3)
    p = a.permute(1, 0)
    assert p.data_ptr() == a.data_ptr() and not p.is_contiguous()
    pytest.raises(RuntimeError, p.view, 6).match("view size is not compatible")  # merges the two swapped dimensions
    r = p.reshape(6)
    assert r.data_ptr() != a.data_ptr() and r.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    b = torch.arange(24.0).view(2, 3, 4).permute(2, 0, 1)  # shape (4, 2, 3), strides (1, 12, 4)
    assert b.view(4, 2, 3, 1).data_ptr() == b.data_ptr()  # a size-1 dimension added
    assert b.view(2, 2, 2, 3).data_ptr() == b.data_ptr()  # the first dimension split
    assert b.view(4, 6).data_ptr() == b.data_ptr()  # dims 1, 2 kept their order (12 = 4 x 3): merge works
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        b.view(8, 3)  # dims 0, 1 were swapped (1 != 12 x 2): merge fails
    for reshaped in (torch.Tensor.view, torch.Tensor.reshape):  # on a contiguous tensor, both a view
        a = torch.zeros((3, 2))
        b = reshaped(a, 2, 3)
        a.fill_(1)
        assert torch.equal(b, torch.ones(2, 3)) and b.data_ptr() == a.data_ptr()
    t = torch.zeros((3, 2)).t()
    copied = t.reshape(6)
    t.fill_(1)
    assert torch.equal(copied, torch.zeros(6))  # this one did copy


def test_note003_lstm_dropout_redraws_the_mask_each_step_between_layers_only():
    single, messages = records_warnings(lambda: nn.LSTM(3, 4, num_layers=1, dropout=0.5))
    assert any("num_layers greater than 1" in m for m in messages)
    sequence = torch.randn(5, 1, 3)
    assert torch.equal(single(sequence)[0], single.eval()(sequence)[0])  # recurrence included: no dropout
    hidden = 4
    lstm = nn.LSTM(hidden, hidden, num_layers=2, dropout=0.5)
    with torch.no_grad():  # layer 2 passes its (dropped-out) input through: h2 = tanh(tanh(x))
        for name in ("weight_hh_l1", "bias_hh_l1", "weight_ih_l1", "bias_ih_l1"):
            getattr(lstm, name).zero_()
        gates = lstm.bias_ih_l1.view(4, hidden)  # order: input, forget, cell, output
        gates[0], gates[1], gates[3] = 50.0, -50.0, 50.0  # input and output open, forget shut
        lstm.weight_ih_l1.view(4, hidden, hidden)[2] = torch.eye(hidden)
    x = torch.randn(8, 1, hidden) * 3
    kept = lstm(x)[0][:, 0].abs() > 1e-6  # False where dropout zeroed layer 1's output
    assert (~kept).any() and kept.any()
    assert len({tuple(step.tolist()) for step in kept}) > 1  # the mask changes across time steps
    assert (lstm.eval()(x)[0].abs() > 1e-6).all()  # eval: no dropout at all


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_note003_trace_and_script():
    traced, messages = records_warnings(lambda: torch.jit.trace(Branchy(), torch.ones(2)))
    assert any("Python boolean" in m for m in messages) and any("deprecated" in m for m in messages)
    negative = torch.full((2,), -3.0)
    assert torch.equal(Branchy()(negative), torch.full((2,), -4.0))
    assert torch.equal(traced(negative), torch.full((2,), -6.0))  # the positive branch, baked in

    class TakesKwargs(nn.Module):
        def forward(self, x, **options):
            return x

    scripted, _ = records_warnings(lambda: torch.jit.script(Branchy()))
    assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(scripted(torch.full((2,), -3.0)), torch.full((2,), -4.0))
    with pytest.raises(torch.jit.frontend.NotSupportedError, match="variable number of arguments"):
        records_warnings(lambda: torch.jit.script(TakesKwargs()))


def test_note003_grad_none_is_what_zero_grad_does_now():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    p.sum().backward()
    released = weakref.ref(p.grad)
    opt.zero_grad()
    assert p.grad is None and released() is None  # the memory is gone
    p.sum().backward()
    grad = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad and torch.equal(grad, torch.zeros(3))  # the old way: the same tensor, zeroed


def test_note004_devices():
    assert "device" not in repr(torch.ones(2)) and torch.ones(2).device == torch.device("cpu")
    assert "device='meta'" in repr(torch.ones(2, device="meta"))
    a = torch.tensor([1, 2, 3, 4])
    moved = a.to("meta")
    assert moved.device.type == "meta" and a.device.type == "cpu" and a.to("cpu") is a
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert torch.tensor([1, 2, 3, 4]).to(device).device.type == device.type
    assert torch.device("cuda").index is None and torch.device("cuda") != torch.device("cuda:0")
    assert torch.device("cuda").type == torch.device("cuda:0").type
    with pytest.raises(RuntimeError, match="Only Tensors of floating point and complex dtype"):
        torch.tensor([1, 2], requires_grad=True)
    assert torch.tensor([1.0, 2.0], requires_grad=True).requires_grad
    assert torch.tensor([1j], requires_grad=True).requires_grad


def test_note004_retain_grad_and_no_grad_examples():
    w = torch.tensor([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
    x = w**3
    y = x + 3
    z = y.mean()
    assert z.item() == 14.0
    x.retain_grad()
    y.retain_grad()
    z.backward()
    assert torch.equal(y.grad, torch.full((2, 2), 0.25)) and torch.equal(x.grad, torch.full((2, 2), 0.25))
    assert w.grad.tolist() == [[0.75, 3.0], [6.75, 3.0]]
    w = torch.tensor([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
    x = w**3
    z = (x + 3).mean()
    z.backward()
    grad, messages = records_warnings(lambda: x.grad)
    assert grad is None and any("not a leaf Tensor is being accessed" in m for m in messages)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        z.backward()  # pow saved w: the second backward finds it freed
    with torch.no_grad():
        w = torch.tensor([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
        z = ((w**3) + 3).mean()
    assert repr(z) == "tensor(14.)" and w.requires_grad and w.is_leaf
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does not have a grad_fn"):
        z.backward()
