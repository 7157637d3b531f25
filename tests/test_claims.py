"""The study notes' claims, one test each, asserting what PyTorch really does.

The notes this project grew from (five Korean study notes, 000 to 004, not part of this repository)
make claims about PyTorch. Each test below gives, in its docstring, the note, the verdict (confirmed, partly,
corrected) and the claim it checks (original, then English), and asserts the true behaviour, so it fails if
PyTorch behaved as a wrong claim says. docs/claims.md is the table of these tests, and says why each verdict.

Where a claim is about CUDA, the `meta` device stands in for the second device (no GPU here); the
docstring says which assertion would read differently on CUDA.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gan.config import BackwardMode
from gan.core.losses import LOSSES
from gan.core.steps import backward_terms, frozen

BCE = LOSSES["bce"]


def records_warnings(fn):
    """Run fn(); return its result and the messages of the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


# note 000 ---------------------------------------------------------------------------------------


def test_note000_no_grad_is_not_a_freeze(tiny_gan):
    """000 (corrected): "gradient freeze 시키고 작업할 때 with torch.no_grad():" (to freeze gradients, use no_grad)."""
    G, D = tiny_gan
    fake = G(torch.randn(4, 16))
    with torch.no_grad():
        loss = BCE.g(D(fake))
        assert all(p.requires_grad for p in D.parameters())  # nothing was frozen
    assert loss.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        loss.backward()  # nothing to backpropagate: G cannot learn through a no_grad D
    with frozen(D):  # requires_grad_(False): the real freeze
        BCE.g(D(fake)).backward()
    assert all(p.grad is None for p in D.parameters())
    assert all(p.grad is not None for p in G.parameters())


def test_note000_device_string_works_like_torch_device():
    """000 (confirmed): 'device = "cuda" if torch.cuda.is_available() else "cpu"' (a device given as a string)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch.zeros(1, device=device).device == torch.device(device)
    assert torch.zeros(1).to("meta").device == torch.device("meta")


def test_note000_norm_dim_and_keepdim():
    """000 (confirmed): "norm(dim=-1) ... 3x3 matrix -> one value per row; default -> a scalar over all values;
    keepdim=True: 3x3 -> [3,1]; keepdim=False: 3x3 -> [3]"."""
    m = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    assert torch.equal(m.norm(dim=-1), torch.tensor([5.0, 2.0, 1.0]))
    assert m.norm(dim=-1, keepdim=True).shape == (3, 1)
    assert m.norm(dim=-1, keepdim=False).shape == (3,)
    assert m.norm().shape == () and m.norm().item() == pytest.approx(30**0.5)


def test_note000_cpu_on_a_cpu_tensor_returns_the_same_object():
    """000 (confirmed): ".cpu() copies a tensor in GPU memory to CPU memory. If it is already in CPU memory, no copy is
    performed and the original object is returned." (On CUDA, x.cuda().cpu() is a new tensor.)"""
    x = torch.randn(3, requires_grad=True)
    assert x.cpu() is x
    assert x.to("cpu") is x


def test_note000_detach_shares_storage_and_can_require_grad_again():
    """000 (partly): ".detach(): Returns a new Tensor, detached from the current graph. The result will never require
    gradient." """
    x = torch.randn(3, requires_grad=True)
    y = x.exp()  # exp saves its output for backward
    d = y.detach()
    assert d is not y and not d.requires_grad and d.data_ptr() == y.data_ptr()
    d.zero_()  # write through the detached tensor
    assert torch.equal(y, torch.zeros(3))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    again = x.detach().requires_grad_()
    assert again.requires_grad and again.is_leaf


def test_note000_numpy_shares_memory_both_ways():
    """000 (confirmed): ".numpy(): This tensor and the returned ndarray share the same underlying storage. Changes to
    self tensor will be reflected in the ndarray and vice versa." """
    t = torch.zeros(3)
    a = t.numpy()
    t[0] = 1.0
    a[1] = 2.0
    assert a.tolist() == [1.0, 2.0, 0.0]
    assert t.tolist() == [1.0, 2.0, 0.0]


def test_note000_numpy_needs_a_cpu_tensor_without_grad():
    """000 (partly): "cpu에 올려져 있는 tensor만 .numpy()를 사용할 수 있다" (only CPU tensors can use .numpy()). (On
    CUDA the first message names cuda:0 instead of meta, and force=True copies.)"""
    with pytest.raises(TypeError, match="can't convert meta device type tensor to numpy"):
        torch.zeros(2, device="meta").numpy()
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
        x.numpy()
    forced = x.numpy(force=True)
    forced[0] = 5.0
    assert x.tolist() == [5.0, 1.0]  # written through, behind autograd's back


def test_note000_astype_float32_copies():
    """000 (partly): '.astype("float32"): converts what was a double in the tensor to float32 explicitly'."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.nn.Linear(2, 2)(torch.zeros(1, 2))
    assert out.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="BFloat16"):
        out.detach().numpy()
    assert out.detach().float().cpu().numpy().dtype == np.float32
    t = torch.zeros(2)
    assert t.numpy().dtype == np.float32
    copied = t.numpy().astype("float32")
    t[0] = 5.0
    assert copied[0] == 0.0  # a copy: the tensor's write does not reach it
    assert torch.zeros(2, dtype=torch.float64).numpy().astype("float32").dtype == np.float32


def test_note000_float32_has_a_24_bit_significand():
    """000 (confirmed): "A float32 only has 24 bits of significand precision, roughly seven digits (log10(2**24) = 7.22)
    ... an 8-digit number cannot in general be stored exactly"."""
    assert torch.tensor(16777217, dtype=torch.float32).item() == 16777216.0
    assert torch.tensor(16777217, dtype=torch.float64).item() == 16777217.0
    assert torch.finfo(torch.float32).eps == 2.0**-23  # 23 stored bits + the implicit one


def test_note000_cpu_then_detach_makes_an_edge_only_when_it_copies():
    """000 (partly): ".cpu().detach().numpy(): an edge for cpu() is created and then removed by detach;
    .detach().cpu().numpy() does not even create it." (`meta` stands in for the GPU: x.to("meta") records the edge that
    x_cuda.cpu() would.)"""
    x = torch.randn(3, requires_grad=True)
    assert x.cpu().grad_fn is None  # same object, a leaf: no edge on the CPU
    assert x.cpu().detach().data_ptr() == x.detach().cpu().data_ptr() == x.data_ptr()
    assert type(x.to("meta").grad_fn).__name__ == "ToCopyBackward0"  # a real copy records an edge
    assert x.detach().to("meta").grad_fn is None  # detach first: nothing recorded


# note 001 ---------------------------------------------------------------------------------------


def test_note001_mixing_devices_raises_except_a_zero_dim_cpu_tensor():
    """001 (partly): "두개의 device가 다른경우 이렇게 연산이 불가능하다" (a cuda tensor + a cpu tensor cannot be
    computed); summary: "cuda와 cpu의 연산이 호환되지 않으므로, 둘의 device를 맞춰줘야한다". (The message on CUDA reads
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"; with meta it names
    meta and cpu.)"""
    on_device = torch.ones(2, device="meta")
    with pytest.raises(RuntimeError, match="Tensor on device cpu is not on the expected device meta"):
        on_device + torch.ones(2)
    with pytest.raises(RuntimeError, match="device"):
        on_device + torch.ones(1)  # one element but 1-dim: not the exception
    assert (on_device + torch.tensor(1.0)).device.type == "meta"  # 0-dim CPU: allowed


def test_note001_tensor_to_returns_a_new_tensor_and_leaves_the_original():
    """001 (corrected): "b.to('cpu')" written as a statement, its result unused, as if it moved b."""
    b = torch.ones(2)
    b.to("meta")
    assert b.device.type == "cpu"
    module = nn.Linear(2, 2)
    assert module.to("meta") is module and module.weight.device.type == "meta"


def test_note001_numpy_works_on_requires_grad_tensor_inside_no_grad():
    """001 (partly): "with torch.no_grad() ... 계산 그래프가 생성되지 않고 torch.tensors와 np.ndarrays를 서로 바꿔서
    사용할 수 있습니다. 그렇지 않다면 detach()를 통해서 바꿔야 한다" (under no_grad, no graph is made and tensors and
    ndarrays are interchangeable; otherwise convert through detach())."""
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        w.numpy()
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


def test_note001_tensor_created_on_a_device_is_a_leaf():
    """001 (corrected): "tensor1 = torch.tensor([1.0,2.0],requires_grad=True,device='cuda'); print(tensor1) #
    tensor([1., 2.], device='cuda:0', grad_fn=<CopyBackwards>)". (Shown with meta as the device and with a dtype move,
    which is the same ToCopy.)"""
    direct = torch.tensor([1.0, 2.0], requires_grad=True, device="meta")
    assert direct.is_leaf and direct.grad_fn is None
    assert "requires_grad=True" in repr(direct) and "grad_fn" not in repr(direct)
    cpu = torch.tensor([1.0, 2.0], requires_grad=True)
    moved = cpu.to("meta")
    assert not moved.is_leaf and type(moved.grad_fn).__name__ == "ToCopyBackward0"
    cpu = torch.tensor([1.0, 2.0], requires_grad=True)
    moved = cpu.to(torch.float64)  # the same ToCopy node; backward runs on the CPU
    moved.sum().backward()
    assert cpu.grad is not None
    grad, messages = records_warnings(lambda: moved.grad)
    assert grad is None and any("not a leaf" in m for m in messages)


def test_note001_numpy_refuses_a_tensor_that_requires_grad():
    """001 (confirmed): "requires_grad 도 true로 되어있어서 ... .detach() 해야한다. 그래야 numpy로 바꿀 수 있다"
    (requires_grad is True, so it must be detached before it can become numpy)."""
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Use tensor.detach\(\).numpy\(\) instead"):
        t.numpy()
    assert t.detach().numpy().tolist() == [1.0, 2.0]


def test_note001_graph_is_recorded_only_for_inputs_that_require_grad():
    """001 (partly): "pytorch tensor는 autograd에 자동으로 미분값이 저장되어있으므로, 쓰지 않을거라면 with
    torch.no_grad() 사용 추천" (tensors automatically store derivatives in autograd, so use no_grad if you will not use
    them)."""
    x, y = torch.randn(3), torch.randn(3)
    assert (x * y).grad_fn is None  # plain data: no graph even with grad mode on
    layer = nn.Linear(3, 1)
    out = layer(x)
    assert out.grad_fn is not None and layer.weight.grad is None  # a graph, but no stored gradient
    with torch.no_grad():
        assert layer(x).grad_fn is None


def test_note001_mixing_tensors_and_ndarrays_is_not_free():
    """001 (corrected): "tensor와 numpy 의 연산은 자유롭다" (operations between tensors and numpy are free)."""
    array = np.ones(2)  # float64
    result, _ = records_warnings(lambda: torch.ones(2) + array)  # NumPy 2 warns about __array_wrap__
    assert isinstance(result, torch.Tensor) and result.dtype == torch.float64
    with pytest.raises(TypeError):
        array + torch.ones(2)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.rand(3, 4) @ torch.from_numpy(np.ones((4, 2)))
    ok = torch.rand(3, 4) @ torch.from_numpy(np.ones((4, 2), dtype=np.float32))  # the note's float32 case
    assert ok.shape == (3, 2)


# note 002 ---------------------------------------------------------------------------------------


def test_note002_backward_implicit_gradient_only_for_scalars():
    """002 (partly): "torch.backward(gradient, retain_graph, create_graph): 인수(기본적으로 1x1 텐서)를 루트 텐서로부터
    추적가능한 모든 리프노드까지 ... 전달" (passes the argument, by default a 1x1 tensor, from the root to every
    reachable leaf)."""
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(torch.ones(3))  # explicit gradient: fine
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    (x * 2).sum().reshape(1, 1).backward()  # a 1x1 output also gets the implicit 1
    assert torch.equal(x.grad, torch.full((3,), 4.0))


def test_note002_no_grad_saves_no_tensors_and_cannot_backprop():
    """002 (partly): "torch.no_grad(): test/추론할 때 유용, autograd 작동을 비활성화, memory 사용량을 줄이고, 계산
    속도를 빠르게 함, backpropagation할 수 없음" (useful for inference; disables autograd; reduces memory, speeds
    computation; cannot backpropagate). Also 004: "history를 기억하지 않는다. 그러므로 memory를 덜 사용한다 ... 더 빠른
    계산이 가능해진다"."""
    x = torch.randn(64, requires_grad=True)
    saved = []

    def forward():
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            hidden = x.exp()
            alive = weakref.ref(hidden)
            out = hidden.sin()
            del hidden
            return out, alive

    out, alive = forward()
    assert len(saved) == 2 and alive() is not None  # exp's output kept alive by the graph
    saved.clear()
    with torch.no_grad():
        out_no_grad, alive = forward()
    assert saved == [] and alive() is None  # nothing saved, the intermediate is gone
    assert torch.equal(out.detach(), out_no_grad)  # the same numbers
    with pytest.raises(RuntimeError, match="does not require grad"):
        out_no_grad.sum().backward()

    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    tokens = torch.randn(2, 5, 16)
    with torch.autograd.profiler.profile() as with_grad:
        expected = layer(tokens)
    with torch.no_grad(), torch.autograd.profiler.profile() as without_grad:
        fast = layer(tokens)
    fused = "aten::_transformer_encoder_layer_fwd"
    assert fused in {e.name for e in without_grad.function_events}
    assert fused not in {e.name for e in with_grad.function_events}
    torch.testing.assert_close(fast, expected.detach())  # close, not necessarily equal: other kernels


def test_note002_eval_changes_batchnorm_and_dropout_not_autograd(tiny_gan):
    """002 (confirmed): "model.eval(): 모든 layer testing 모드인 것을 알림, 실제로 batchnorm이나 dropout 계층이 training
    대신 eval에서 작동하도록 유도함" (tells every layer it is testing; BatchNorm and Dropout behave in eval mode)."""
    G, _ = tiny_gan
    z = torch.randn(8, 16)
    train_out = G(z)
    G.eval()
    bn = next(m for m in G.modules() if isinstance(m, nn.BatchNorm2d))
    stats = bn.running_mean.clone()
    eval_out = G(z)
    assert not torch.allclose(train_out, eval_out)  # batch statistics vs running statistics
    assert torch.equal(stats, bn.running_mean)  # eval does not update the running statistics
    assert eval_out.grad_fn is not None  # ... and still builds a graph
    eval_out.sum().backward()
    assert all(p.grad is not None for p in G.parameters())
    drop = nn.Dropout(0.5)
    ones = torch.ones(1000)
    assert (drop(ones) == 0).any()
    assert torch.equal(drop.eval()(ones), ones)


def test_note002_detach_makes_a_leaf_and_stops_at_it(tiny_gan):
    """002 (confirmed): "A Network -> point X -> B Network -> Loss: B Network만 학습시키고 싶을 경우, X에서 detach (X
    leaf node가 됨)" and "GAN ... discriminator만 훈련하고 싶을 때 detach 사용" (detach at X to train only B; X becomes
    a leaf)."""
    G, D = tiny_gan
    fake = G(torch.randn(4, 16))
    x = fake.detach()
    assert x.is_leaf and not x.requires_grad and not fake.is_leaf
    BCE.d(D(torch.randn(4, 1, 16, 16)), D(x)).backward()
    assert all(p.grad is not None for p in D.parameters())
    assert all(p.grad is None for p in G.parameters())


def test_note002_grad_starts_none_and_accumulates():
    """002 (confirmed): "grad: 기본값은 None, backward() ... 이후 호출에서 backward()에 대한 gradient를 누적함" (.grad
    is None by default, then holds the gradient, and later backward() calls add to it). Also 004: "backward(): ... grad
    attribute(속성)에 gradient 정보 축적"."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    assert w.grad is None
    (w * 3).sum().backward()
    assert w.grad.tolist() == [3.0, 3.0]
    (w * w).sum().backward()  # a second graph: its gradient is added, not assigned
    assert w.grad.tolist() == [5.0, 7.0]


def test_note002_tensors_not_requiring_grad_are_leaves():
    """002 (confirmed): "requires_grad False Tensor는 보통 leaf Tensor가 됨" and "Computational Graph에 포함되지 않는
    node 역시 leaf node" (tensors that do not require grad are usually leaves; nodes outside the graph are leaves too).
    """
    a, b = torch.randn(2), torch.randn(2)
    assert a.is_leaf and (a * b + 1).is_leaf
    w = torch.randn(2, requires_grad=True)
    with torch.no_grad():
        assert (w * 2).is_leaf
    assert w.detach().is_leaf


def test_note002_a_leaf_is_a_tensor_without_grad_fn_not_a_user_created_one():
    """002 (partly): "requires_grad가 True이고, 사용자가 직접 만든 경우 leaf Tensor가 됨. 이 때는 연산의 결과가 아니므로
    grad_fn None" (a tensor that requires grad is a leaf when the user created it directly; not being an op result, its
    grad_fn is None)."""
    assert nn.Linear(2, 2).weight.is_leaf
    revived = (torch.randn(2, requires_grad=True) * 2).detach().requires_grad_()
    assert revived.is_leaf and revived.requires_grad and revived.grad_fn is None
    user_made = torch.randn(2, requires_grad=True).double()
    assert not user_made.is_leaf and user_made.grad_fn is not None


def test_note002_only_leaves_get_grad_unless_retain_grad():
    """002 (confirmed): "leaf Tensor만이 backward()시 grad를 구성함 ... leaf Tensor가 아닌 Tensor에 대해 grad를
    구성하려면, retain_grad를 사용" and "requires_grad와 is_leaf가 동시에 True인 경우에만 grad attribute populate" (only
    leaves get .grad; use retain_grad for the others)."""
    x = torch.randn(3, requires_grad=True)
    kept, dropped = x * 2, x * 3
    kept.retain_grad()
    (kept.sum() + dropped.sum()).backward()
    assert kept.grad.tolist() == [1.0, 1.0, 1.0]
    grad, messages = records_warnings(lambda: dropped.grad)
    assert grad is None and any("retain_grad" in m for m in messages)
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        torch.ones(2).retain_grad()


def test_note002_backward_frees_saved_tensors_not_the_graph():
    """002 (partly): "기본적으로 backpropagate하면 computational graph는 파괴됨. BP를 여러번 하려면 ... computational
    graph를 유지해야 함" (backward destroys the graph; to backpropagate several times the graph must be kept with
    retain_graph)."""
    x = torch.randn(3, requires_grad=True)
    y = (x + 1).sum()
    y.backward()
    y.backward()  # nothing was saved, nothing was freed
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()  # kept: works


def test_note002_minibatch_accumulation_needs_no_retain_graph():
    """002 (corrected): "retain_graph: mini-batch와 같이, iteration에서 여러 번 backpropagate해야 할 때 유용"
    (retain_graph is useful when you backpropagate several times per iteration, as with mini-batches)."""
    w = torch.randn(4, requires_grad=True)
    data = torch.randn(6, 4)
    for chunk in data.split(2):  # three mini-batches, three graphs, no retain_graph
        (chunk @ w).pow(2).sum().backward()
    full = torch.autograd.grad((data @ w).pow(2).sum(), w)[0]
    torch.testing.assert_close(w.grad, full)


def test_note002_two_losses_retain_graph_or_sum_give_the_same_gradients():
    """002 (confirmed): "loss에서 retain_graph=True를 하는 방법이 있고, total_loss = loss1 + loss2를 해서 total_loss
    backward하는 방법이 있다" (either backward each loss with retain_graph=True, or backward their sum)."""
    grads = {}
    for mode in BackwardMode:
        torch.manual_seed(3)
        w = torch.randn(5, requires_grad=True)
        shared = torch.tanh(w * 2)  # both losses go through this node
        terms = {"a": shared.pow(2).sum(), "b": shared.sin().sum()}
        backward_terms(terms, [w], mode)
        grads[mode] = w.grad.clone()
    torch.testing.assert_close(grads[BackwardMode.summed], grads[BackwardMode.separate])


def test_note002_without_detach_a_gan_step_raises_and_retain_graph_only_hides_it(tiny_gan):
    """002 (partly): "BP를 여러번 하려면 ... computational graph를 유지해야 함. BP를 언제 여러번 함? ... 3. GAN에서"
    (keep the graph with retain_graph when backpropagating several times: ... 3. in GANs)."""
    G, D = tiny_gan
    real, z = torch.rand(8, 1, 16, 16) * 2 - 1, torch.randn(8, 16)
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def d_step(fake: torch.Tensor, **backward) -> None:
        BCE.d(D(real), D(fake)).backward(**backward)
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)

    def g_backward(fake: torch.Tensor) -> list[torch.Tensor]:
        with frozen(D):
            BCE.g(D(fake)).backward()
        grads = [p.grad.clone() for p in G.parameters()]
        G.zero_grad(set_to_none=True)
        return grads

    state = {k: v.clone() for k, v in D.state_dict().items()}
    fake = G(z)
    d_step(fake)  # no detach
    assert all(p.grad is not None for p in G.parameters())  # D's loss reached G
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        g_backward(fake)

    D.load_state_dict(state)
    G.zero_grad(set_to_none=True)
    fake = G(z)
    d_step(fake.detach())  # the fix: D's backward stops at the fake images
    assert all(p.grad is None for p in G.parameters())
    clean = g_backward(fake)

    D.load_state_dict(state)
    fake = G(z)
    d_step(fake, retain_graph=True)  # the patch: no error, but G's .grad holds D's gradient
    polluted = g_backward(fake)
    assert not all(torch.allclose(a, b) for a, b in zip(polluted, clean))


def test_note002_separate_backwards_do_not_give_each_loss_its_own_optimizer_or_step_size():
    """002 (partly): separate backward calls (rather than a summed loss) for when you want "optimizer를 달리 쓰고
    싶거나, step-size(or learning rate)를 조정하고 싶을 때" (to use different optimizers, or to adjust the step size or
    learning rate)."""

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
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss_b.backward()


def test_note002_requires_grad_default_depends_on_what_made_the_tensor():
    """002 (partly): "requires_grad: 기본값은 False이다!" (the default of requires_grad is False)."""
    assert not torch.randn(2).requires_grad and not torch.tensor([1.0]).requires_grad
    assert nn.Parameter(torch.randn(2)).requires_grad
    assert all(p.requires_grad for p in nn.Conv2d(1, 1, 3).parameters())
    assert (torch.randn(2) * nn.Parameter(torch.randn(2))).requires_grad


def test_note002_requires_grad_false_freezes_part_of_a_model(tiny_gan):
    """002 (confirmed): "사전 훈련된 모델을 그냥 사용하고 싶을 때(업데이트 없이): 모델의 일부를 고정할 때 유용" (set
    requires_grad to use a pretrained model without updating it; freezing part of a model)."""
    G, D = tiny_gan
    with frozen(D):
        BCE.g(D(G(torch.randn(4, 16)))).backward()
    assert all(p.grad is None for p in D.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in G.parameters())


def test_note002_gradient_reaches_an_input_that_requires_grad(tiny_gan):
    """002 (confirmed): "입력값 자체를 backpropagating할 때 (Adversarial과 같은 특수한 케이스 - input이 스스로 update)"
    (requires_grad on the input itself, e.g. adversarial examples)."""
    _, D = tiny_gan
    D.eval()  # per-sample logits, so the step below moves each image's own score
    x = torch.randn(4, 1, 16, 16, requires_grad=True)
    with frozen(D):
        D(x).sum().backward()
        with torch.no_grad():
            stepped = x + 0.01 * x.grad.sign()
            assert (D(stepped) > D(x)).all()
    assert x.grad is not None


def test_note002_forward_example_attributes():
    """002 (confirmed): "a = torch.tensor(2.0, requires_grad=True) # grad None, grad_fn None, is_leaf True; b =
    torch.tensor(3.0) # is_leaf True, requires_grad False; c = a*b # data 6.0, grad_fn MulBackward, is_leaf False,
    requires_grad True"; "자손들이 모두 requires_grad를 이어받음"."""
    a = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(3.0)
    c = a * b
    assert (a.grad, a.grad_fn, a.is_leaf, a.requires_grad) == (None, None, True, True)
    assert (b.grad_fn, b.is_leaf, b.requires_grad) == (None, True, False)
    assert c.item() == 6.0 and type(c.grad_fn).__name__ == "MulBackward0"
    assert not c.is_leaf and c.requires_grad


def test_note002_dynamic_graph_mm_example():
    """002 (confirmed): "h2h = torch.mm(W_h, prev_h.t()) # W_h 20x20, prev_h 1x20: 행렬곱을 하려면 prev_h를 20X1으로
    만들어야 함" (mm needs prev_h transposed to 20x1), then tanh, sum, backward."""
    W_h, W_x = torch.randn(20, 20, requires_grad=True), torch.randn(20, 10, requires_grad=True)
    x, prev_h = torch.randn(1, 10), torch.randn(1, 20)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(W_h, prev_h)
    next_h = (torch.mm(W_h, prev_h.t()) + torch.mm(W_x, x.t())).tanh()
    assert next_h.shape == (20, 1)
    next_h.sum().backward()
    assert W_h.grad.shape == (20, 20) and W_x.grad.shape == (20, 10)
    assert x.grad is None and prev_h.grad is None


def test_note002_backward_gradient_argument_scales_not_evaluates():
    """002 (partly): "x = torch.tensor(1.0, requires_grad=True); z = x ** 3; z.backward(torch.tensor(3.0)) # (z' = 3 *
    x**2, z'(3) = 3 * (3.0)**2) ... x.grad == tensor(9.0)"."""
    x = torch.tensor(1.0, requires_grad=True)
    (x**3).backward(torch.tensor(3.0))
    assert x.grad.item() == 9.0
    x = torch.tensor(2.0, requires_grad=True)
    (x**3).backward(torch.tensor(3.0))
    assert x.grad.item() == 3.0 * 3 * 2.0**2  # 36: the upstream 3 times z'(2) = 12


def test_note002_no_grad_example_result_does_not_require_grad():
    """002 (confirmed): "with torch.no_grad(): y = x*2 # y.requires_grad = False — computational graph가 아니고, 입력
    데이터를 캐싱하지 않음" (no graph, the inputs are not cached)."""
    x = torch.tensor(1.0, requires_grad=True)
    assert (x * 2).requires_grad
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None and x.requires_grad


def test_note002_detach_example():
    """002 (confirmed): "y = x.detach(); print(y.requires_grad) # False; print(x.eq(y).all()) # tensor(True)"; 004:
    "detach(): 계산 정보를 더 이상 기억하지 않음 (stop tracking history)"."""
    x = torch.tensor(1.0, requires_grad=True)
    y = x.detach()
    assert not y.requires_grad and bool(x.eq(y).all())
    assert (y * 2).grad_fn is None  # nothing after detach is tracked
    assert y.data_ptr() == x.data_ptr()


# note 003 ---------------------------------------------------------------------------------------


def test_note003_Tensor_is_a_class_and_Tensor_call_is_empty():
    """003 (confirmed): "Tensor: class, T = torch.Tensor(): 빈 tensor" and "tensor: function"."""
    assert isinstance(torch.Tensor, type) and not isinstance(torch.tensor, type)
    empty = torch.Tensor()
    assert empty.shape == (0,) and empty.dtype == torch.float32


def test_note003_Tensor_converts_python_ints_to_float_but_keeps_a_tensors_dtype():
    """003 (partly): "Tensor: int to float"."""
    assert torch.Tensor([1, 2]).dtype == torch.float32
    assert torch.Tensor(torch.arange(3)).dtype == torch.int64
    assert torch.Tensor(3).shape == (3,)
    assert torch.tensor(3).shape == () and torch.tensor(3).item() == 3


def test_note003_Tensor_shares_memory_with_tensors_and_float32_arrays():
    """003 (partly): "Tensor: torch data이면, 같은 메모리 공간; list나 numpy면, copy 후 생성" (with torch data, the same
    memory; with a list or numpy, a copy)."""
    t = torch.zeros(3)
    alias = torch.Tensor(t)
    t[0] = 1.0
    assert alias is not t and alias[0].item() == 1.0
    array32 = np.zeros(3, dtype=np.float32)
    from32 = torch.Tensor(array32)
    array32[0] = 7.0
    assert from32[0].item() == 7.0  # shared, not copied
    array64 = np.zeros(3)
    from64 = torch.Tensor(array64)
    array64[0] = 7.0
    assert from64[0].item() == 0.0 and from64.dtype == torch.float32  # copied
    values = [0.0, 0.0]
    from_list = torch.Tensor(values)
    values[0] = 7.0
    assert from_list[0].item() == 0.0


def test_note003_tensor_without_data_is_an_error():
    """003 (confirmed): "T = torch.tensor(): 데이터가 없으므로 error" (no data, so an error)."""
    with pytest.raises(TypeError, match='missing 1 required positional arguments: "data"'):
        torch.tensor()


def test_note003_tensor_keeps_integers_integers():
    """003 (confirmed): "tensor: int to int"."""
    assert torch.tensor([1, 2]).dtype == torch.int64
    assert torch.tensor([1.0]).dtype == torch.float32
    assert torch.tensor(np.zeros(1)).dtype == torch.float64


def test_note003_tensor_always_copies():
    """003 (confirmed): "tensor: memory copy"."""
    t = torch.zeros(2)
    copy, messages = records_warnings(lambda: torch.tensor(t))
    t[0] = 1.0
    assert copy[0].item() == 0.0 and any("detach().clone()" in m for m in messages)
    array = np.zeros(2, dtype=np.float32)
    copied, shared = torch.tensor(array), torch.as_tensor(array)
    array[0] = 1.0
    assert copied[0].item() == 0.0 and shared[0].item() == 1.0


def test_note003_nn_loss_module_equals_the_functional_form():
    """003 (confirmed): "nn : class, F : 함수" (nn holds classes, F functions)."""
    logits, targets = torch.randn(8), torch.rand(8)
    module = nn.BCEWithLogitsLoss()
    assert isinstance(module, nn.Module) and not isinstance(F.binary_cross_entropy_with_logits, nn.Module)
    assert torch.equal(module(logits, targets), F.binary_cross_entropy_with_logits(logits, targets))


def test_note003_cross_entropy_module_stores_weight_as_a_buffer():
    """003 (partly): "nn.CrossEntropy: weight 한 번만 pass; F.cross_entropy: weight 계속 pass" (the module takes the
    weight once, the function on every call)."""
    weight = torch.tensor([1.0, 2.0, 3.0])
    logits, target = torch.randn(5, 3), torch.tensor([0, 1, 2, 2, 1])
    module = nn.CrossEntropyLoss(weight=weight)
    assert torch.equal(module(logits, target), F.cross_entropy(logits, target, weight=weight))
    assert "weight" in module.state_dict()
    assert module.to(torch.float64).weight.dtype == torch.float64


def test_note003_dot_takes_vectors_only():
    """003 (confirmed): "dot: 벡터 X 벡터" (dot: vector x vector)."""
    assert torch.dot(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])).item() == 11.0
    with pytest.raises(RuntimeError, match="1D tensors expected"):
        torch.dot(torch.ones(2, 2), torch.ones(2, 2))


def test_note003_mm_does_not_broadcast():
    """003 (confirmed): "mm: 행렬 X 행렬, broadcasting 지원 안 됨" (mm: matrix x matrix, no broadcasting)."""
    with pytest.raises(RuntimeError, match="self must be a matrix"):
        torch.mm(torch.ones(2, 3, 4), torch.ones(4, 5))
    with pytest.raises(RuntimeError, match="mat2 must be a matrix"):
        torch.mm(torch.ones(3, 4), torch.ones(4))
    assert torch.bmm(torch.ones(2, 3, 4), torch.ones(2, 4, 5)).shape == (2, 3, 5)


def test_note003_matmul_broadcasts():
    """003 (confirmed): "matmul: 행렬 X 행렬, 행렬 X 벡터, broadcasting 지원됨"."""
    assert torch.matmul(torch.ones(3, 4), torch.ones(4)).shape == (3,)
    assert torch.matmul(torch.ones(2, 3, 4), torch.ones(4, 5)).shape == (2, 3, 5)
    assert torch.matmul(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 6)).shape == (2, 5, 3, 6)


def test_note003_permute_is_a_view_that_view_follows_only_where_strides_allow():
    """003 (corrected): "permute과 view는 모양만 바뀌는 거지만, reshape는 rearrange" (permute and view only change the
    shape, reshape rearranges)."""
    a = torch.arange(6.0).view(2, 3)
    p = a.permute(1, 0)
    assert p.data_ptr() == a.data_ptr() and not p.is_contiguous()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        p.view(6)  # merges the two swapped dimensions
    r = p.reshape(6)
    assert r.data_ptr() != a.data_ptr() and r.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]

    b = torch.arange(24.0).view(2, 3, 4).permute(2, 0, 1)  # shape (4, 2, 3), strides (1, 12, 4)
    assert b.view(4, 2, 3, 1).data_ptr() == b.data_ptr()  # a size-1 dimension added
    assert b.view(2, 2, 2, 3).data_ptr() == b.data_ptr()  # the first dimension split
    assert b.view(4, 6).data_ptr() == b.data_ptr()  # dims 1, 2 kept their order (12 = 4 x 3): merge works
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        b.view(8, 3)  # dims 0, 1 were swapped (1 != 12 x 2): merge fails


def test_note003_view_shares_memory():
    """003 (confirmed): "view: copy하지 않고 같은 메모리 주소 사용, 원래 tensor 값 바꾸면 같이 바뀜 — a =
    torch.zeros((3,2)); b = a.view(2,3); a.fill_(1) => b = [[1,1,1],[1,1,1]]"."""
    a = torch.zeros((3, 2))
    b = a.view(2, 3)
    a.fill_(1)
    assert torch.equal(b, torch.ones(2, 3))


def test_note003_reshape_returns_a_view_when_it_can():
    """003 (corrected): "reshape: copy 해서 reshape, 원래 tensor와 구별됨 — a = torch.zeros((3,2)); b = a.reshape(2,3);
    a.fill_(1) => b = [[0,0,0],[0,0,0]]"."""
    a = torch.zeros((3, 2))
    b = a.reshape(2, 3)
    a.fill_(1)
    assert torch.equal(b, torch.ones(2, 3))
    assert b.data_ptr() == a.data_ptr()
    t = torch.zeros((3, 2)).t()
    copied = t.reshape(6)
    t.fill_(1)
    assert torch.equal(copied, torch.zeros(6))  # this one did copy


def test_note003_lstm_dropout_redraws_the_mask_each_step_between_layers_only():
    """003 (partly): "GRU나 LSTM에 구현된 dropout은 mask가 매 time step마다 바뀌게 구현되어 있다" (the dropout of
    GRU/LSTM draws a new mask at every time step, so a fixed mask, e.g. LockedDropout, must be written by hand)."""
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


def test_note003_trace_records_one_path():
    """003 (confirmed): "torch tracing: 입력값을 사용하여 ... 입력값의 흐름을 통해 모델 기록, flow가 기록되기에
    statically fix됨" (tracing records the flow of an example input, so it is statically fixed)."""

    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    traced, messages = records_warnings(lambda: torch.jit.trace(Branchy(), torch.ones(2)))
    assert any("Python boolean" in m for m in messages)
    assert any("deprecated" in m for m in messages)
    negative = torch.full((2,), -3.0)
    assert torch.equal(Branchy()(negative), torch.full((2,), -4.0))
    assert torch.equal(traced(negative), torch.full((2,), -6.0))  # the positive branch, baked in


def test_note003_script_compiles_control_flow_but_not_all_python():
    """003 (confirmed): "torch script: 컴파일러가 직접 모델 코드 분석하여 컴파일 ... Dynamic한 control(if, break)
    사용가능, 하지만 지원하지 않음 python code 및 type 추정 문제 있어서 확인 필요" (script compiles the code, so
    if/break work; some Python is unsupported and types must be checked)."""

    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    class TakesKwargs(nn.Module):
        def forward(self, x, **options):
            return x

    scripted, _ = records_warnings(lambda: torch.jit.script(Branchy()))
    assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(scripted(torch.full((2,), -3.0)), torch.full((2,), -4.0))
    with pytest.raises(torch.jit.frontend.NotSupportedError, match="variable number of arguments"):
        records_warnings(lambda: torch.jit.script(TakesKwargs()))


def test_note003_grad_none_is_what_zero_grad_does_now():
    """003 (partly): "Faster Training: for param in model.parameters(): param.grad = None"."""
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


# note 004 ---------------------------------------------------------------------------------------


def test_note004_repr_shows_a_non_cpu_device():
    """004 (confirmed): "GPU에 있는 경우 그냥 tensor를 출력해도 cuda에 올라가 있는 것이 표시" (printing a GPU tensor
    shows its device) and ".device: 해당 tensor가 CPU, GPU 중 어디에 있는지". (On CUDA: "device='cuda:0'"; meta also
    hides the values, which it does not have.)"""
    assert "device" not in repr(torch.ones(2)) and torch.ones(2).device == torch.device("cpu")
    assert "device='meta'" in repr(torch.ones(2, device="meta"))


def test_note004_to_moves_by_returning_a_new_tensor():
    """004 (confirmed): "to('cuda'): tensor를 GPU에 올릴 때 사용 ... a = a.to('cuda'); a = a.to('cpu')"."""
    a = torch.tensor([1, 2, 3, 4])
    moved = a.to("meta")
    assert moved.device.type == "meta" and a.device.type == "cpu"
    assert a.to("cpu") is a


def test_note004_torch_device_objects():
    """004 (confirmed): 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu"); a = a.to(device)'."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert torch.tensor([1, 2, 3, 4]).to(device).device.type == device.type
    assert torch.device("cuda").index is None
    assert torch.device("cuda") != torch.device("cuda:0")
    assert torch.device("cuda").type == torch.device("cuda:0").type


def test_note004_requires_grad_needs_a_floating_dtype():
    """004 (confirmed): "requires_grad: True로 설정 시 모든 연산들을 기억 <tensor 내 element는 int가 아닌 float
    자료형이어야>" (True records all operations; the elements must be float, not int)."""
    with pytest.raises(RuntimeError, match="Only Tensors of floating point and complex dtype"):
        torch.tensor([1, 2], requires_grad=True)
    assert torch.tensor([1.0, 2.0], requires_grad=True).requires_grad
    assert torch.tensor([1j], requires_grad=True).requires_grad


def test_note004_retain_grad_example_values():
    """004 (confirmed): "w = [[1,2],[3,2]] (requires_grad); x = w**3; y = x + 3; z = y.mean() = 14; x.retain_grad();
    y.retain_grad(); z.backward(): y.grad = x.grad = 0.25 everywhere; w.grad = [[0.75, 3.0], [6.75, 3.0]]";
    "retain_grad(): 이것을 하지 않으면 중간 변수에 대한 gradient는 저장 안됨"."""
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


def test_note004_grad_of_a_non_leaf_is_none_with_a_warning_not_an_error():
    """004 (corrected): "x.retain_grad(), y.retain_grad()를 하지 않으면 x.grad, y.grad를 하는 경우 다음과 같은 에러
    메시지가 발생한다: RuntimeError: Trying to backward through the graph a second time, but the buffers have already
    been freed" (without retain_grad, reading x.grad raises that error)."""
    w = torch.tensor([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
    x = w**3
    z = (x + 3).mean()
    z.backward()
    grad, messages = records_warnings(lambda: x.grad)
    assert grad is None
    assert any("not a leaf Tensor is being accessed" in m for m in messages)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        z.backward()  # pow saved w: the second backward finds it freed


def test_note004_no_grad_example_backward_error():
    """004 (confirmed): "with torch.no_grad(): w = torch.tensor(..., requires_grad=True); x = w**3; y = x + 3; z =
    y.mean(); print(z) >> tensor(14.) ... z.backward() >> RuntimeError: element 0 of tensors does not require grad and
    does not have a grad_fn"."""
    with torch.no_grad():
        w = torch.tensor([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
        z = ((w**3) + 3).mean()
    assert repr(z) == "tensor(14.)"
    assert w.requires_grad and w.is_leaf
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does not have a grad_fn"):
        z.backward()
