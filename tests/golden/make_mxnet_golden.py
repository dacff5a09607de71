"""Regenerates ``tests/golden/mxnet_outputs.npz`` from real Apache MXNet 1.9.1.

MXNet is not a dependency of funcnet; it lives in a separate virtualenv outside
the repository. To regenerate (from the repository root)::

    python3 -m venv /work/mxvenv
    /work/mxvenv/bin/pip install "numpy<1.24" mxnet==1.9.1
    /work/mxvenv/bin/python tests/golden/make_mxnet_golden.py

The script builds small fixed inputs (seeded numpy, float32), runs each MXNet
output operator in every mode that funcnet.outputs mirrors, and stores the
inputs, the forward outputs and the gradients of every input (data *and* label)
after ``backward()`` without head gradients, i.e. MXNet's default head gradient
of ones, which output operators ignore anyway.

File layout: ``meta`` is a JSON string, a list of cases
``{"name", "op", "kwargs", "inputs": [...], "kind"}``; for each case the arrays are
``<name>/in/<input>``, ``<name>/out`` (or ``<name>/out<i>`` for groups) and
``<name>/grad/<input>``.
"""

from __future__ import annotations

import json
import os

import mxnet as mx
import numpy as np
from mxnet import autograd

assert mx.__version__ == "1.9.1", mx.__version__

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.join(HERE, "mxnet_outputs.npz")

rs = np.random.RandomState(20240611)
arrays: dict = {}
cases: list = []

# funcnet names -> MXNet operators (keyword names are identical).
MX_OPS = {
    "softmax_output": mx.nd.SoftmaxOutput,
    "linear_regression_output": mx.nd.LinearRegressionOutput,
    "logistic_regression_output": mx.nd.LogisticRegressionOutput,
    "mae_regression_output": mx.nd.MAERegressionOutput,
    "svm_output": mx.nd.SVMOutput,
    "make_loss": mx.nd.MakeLoss,
}


def f32(x):
    return np.asarray(x, dtype=np.float32)


def add_case(name, op, inputs: dict, **kwargs):
    """Runs ``op`` under autograd and records outputs and every input's grad."""
    assert not any(c["name"] == name for c in cases), name
    nds = {}
    for key, value in inputs.items():
        nds[key] = mx.nd.array(f32(value), dtype="float32")
        nds[key].attach_grad()
    with autograd.record():
        out = MX_OPS[op](*nds.values(), **kwargs)
    out.backward()
    for key, value in inputs.items():
        arrays[f"{name}/in/{key}"] = f32(value)
        arrays[f"{name}/grad/{key}"] = nds[key].grad.asnumpy()
    arrays[f"{name}/out"] = out.asnumpy()
    cases.append({"name": name, "op": op, "kwargs": kwargs, "inputs": list(inputs), "kind": "single"})


def int_labels(shape, num_classes, ignore=-1.0, n_ignore=0):
    lab = rs.randint(0, num_classes, size=shape).astype(np.float32)
    flat = lab.reshape(-1)
    if n_ignore:
        flat[rs.choice(flat.size, n_ignore, replace=False)] = ignore
    return flat.reshape(shape)


# --------------------------------------------------------------------------- #
# SoftmaxOutput, 2-D data (N, C), integer labels (N,).
# --------------------------------------------------------------------------- #
x2 = rs.randn(6, 5) * 2
lab2 = int_labels((6,), 5, n_ignore=2)  # two rows carry ignore_label -1
for norm in ("null", "batch", "valid"):
    for use_ignore in (False, True):
        for gs in (1.0, 0.5):
            add_case(
                f"softmax_2d_{norm}_ig{int(use_ignore)}_gs{gs}",
                "softmax_output",
                {"data": x2, "label": lab2},
                normalization=norm,
                use_ignore=use_ignore,
                grad_scale=gs,
            )
# A non-default ignore_label, and labels that all equal it (valid count clamps to 1).
lab2b = f32([2, 0, 2, 4, 1, 2])
for norm in ("null", "valid"):
    add_case(
        f"softmax_2d_ignore2_{norm}",
        "softmax_output",
        {"data": x2, "label": lab2b},
        use_ignore=True,
        ignore_label=2.0,
        normalization=norm,
    )
add_case(
    "softmax_2d_all_ignored_valid",
    "softmax_output",
    {"data": x2, "label": np.full((6,), -1.0)},
    use_ignore=True,
    normalization="valid",
    grad_scale=3.0,
)
# Fractional / out-of-range labels: MXNet truncates toward zero (C cast).
add_case(
    "softmax_2d_fractional",
    "softmax_output",
    {"data": x2, "label": f32([0.7, 1.9, -0.5, 3.2, -1.0, 4.99])},
    use_ignore=True,
    normalization="valid",
)
add_case("softmax_2d_out_of_range", "softmax_output", {"data": x2, "label": f32([0, 7, 1, -3, 4, 2])})
# Label smoothing.
for alpha in (0.1, 0.3):
    for use_ignore in (False, True):
        for norm in ("null", "valid"):
            add_case(
                f"softmax_2d_smooth{alpha}_ig{int(use_ignore)}_{norm}",
                "softmax_output",
                {"data": x2, "label": lab2},
                smooth_alpha=alpha,
                use_ignore=use_ignore,
                normalization=norm,
                grad_scale=2.0,
            )
# Probability labels (label.shape == data.shape): plain (out - label) * grad_scale.
prob = rs.rand(6, 5)
prob = prob / prob.sum(1, keepdims=True)
for norm in ("null", "batch"):
    add_case(
        f"softmax_2d_prob_{norm}",
        "softmax_output",
        {"data": x2, "label": prob},
        normalization=norm,
        grad_scale=1.5,
        use_ignore=True,
    )

# --------------------------------------------------------------------------- #
# SoftmaxOutput, multi_output: data (N, C, d1, ...), softmax over axis 1.
# --------------------------------------------------------------------------- #
x3 = rs.randn(2, 4, 3)
lab3 = int_labels((2, 3), 4, n_ignore=2)
for norm in ("null", "batch", "valid"):
    for use_ignore in (False, True):
        add_case(
            f"softmax_mo3_{norm}_ig{int(use_ignore)}",
            "softmax_output",
            {"data": x3, "label": lab3},
            multi_output=True,
            normalization=norm,
            use_ignore=use_ignore,
            grad_scale=1.5,
        )
x4 = rs.randn(3, 4, 2, 3)
lab4 = int_labels((3, 2, 3), 4, n_ignore=3)
for norm in ("null", "batch", "valid"):
    for use_ignore in (False, True):
        add_case(
            f"softmax_mo4_{norm}_ig{int(use_ignore)}",
            "softmax_output",
            {"data": x4, "label": lab4},
            multi_output=True,
            normalization=norm,
            use_ignore=use_ignore,
        )
# The other label layouts MXNet accepts: (N, d1*d2) and (N, 1, d1, d2).
add_case(
    "softmax_mo4_label_flat",
    "softmax_output",
    {"data": x4, "label": lab4.reshape(3, 6)},
    multi_output=True,
    normalization="batch",
    use_ignore=True,
)
add_case(
    "softmax_mo4_label_keepdim",
    "softmax_output",
    {"data": x4, "label": lab4.reshape(3, 1, 2, 3)},
    multi_output=True,
    normalization="valid",
    use_ignore=True,
)
# multi_output on 2-D data: one position per sample.
add_case(
    "softmax_mo2_batch",
    "softmax_output",
    {"data": x2, "label": lab2},
    multi_output=True,
    normalization="batch",
    use_ignore=True,
)
# Probability label under multi_output.
prob4 = rs.rand(3, 4, 2, 3)
prob4 = prob4 / prob4.sum(1, keepdims=True)
add_case("softmax_mo4_prob", "softmax_output", {"data": x4, "label": prob4}, multi_output=True, grad_scale=0.5)

# --------------------------------------------------------------------------- #
# SoftmaxOutput, preserve_shape: softmax over the last axis, label data.shape[:-1].
# --------------------------------------------------------------------------- #
xp = rs.randn(2, 3, 4)
labp = int_labels((2, 3), 4, n_ignore=2)
for norm in ("null", "batch", "valid"):
    add_case(
        f"softmax_ps_{norm}",
        "softmax_output",
        {"data": xp, "label": labp},
        preserve_shape=True,
        normalization=norm,
        use_ignore=True,
        grad_scale=2.0,
    )
add_case(
    "softmax_ps_smooth",
    "softmax_output",
    {"data": xp, "label": labp},
    preserve_shape=True,
    smooth_alpha=0.2,
    normalization="batch",
)

# --------------------------------------------------------------------------- #
# Regression outputs.
# --------------------------------------------------------------------------- #
for op in ("linear_regression_output", "logistic_regression_output", "mae_regression_output"):
    short = op.split("_")[0]
    xr = rs.randn(4, 3)
    yr = rs.randn(4, 3) if short != "logistic" else rs.rand(4, 3)
    yr[0, 0] = xr[0, 0]  # an exact tie (MAE: sign(0) -> -1)
    for gs in (1.0, 2.5):
        add_case(f"{short}_2d_gs{gs}", op, {"data": xr, "label": yr}, grad_scale=gs)
    # (N, 1) data with (N,) label.
    add_case(f"{short}_n1", op, {"data": rs.randn(5, 1), "label": rs.rand(5)})
    # 3-D data with a label of the same size but another shape.
    add_case(f"{short}_3d_flatlabel", op, {"data": rs.randn(2, 3, 2), "label": rs.rand(2, 6)}, grad_scale=0.5)
    # 1-D data: one output per sample.
    add_case(f"{short}_1d", op, {"data": rs.randn(4), "label": rs.rand(4)})

# --------------------------------------------------------------------------- #
# SVMOutput: L2 (default) and L1 (use_linear) with margins and coefficients.
# --------------------------------------------------------------------------- #
xs = rs.randn(6, 5) * 1.5
labs = f32([0, 1, 2, 3, 4, 2])
for use_linear in (False, True):
    for margin in (1.0, 0.5):
        for reg in (1.0, 2.0):
            add_case(
                f"svm_l{1 if use_linear else 2}_m{margin}_r{reg}",
                "svm_output",
                {"data": xs, "label": labs},
                margin=margin,
                regularization_coefficient=reg,
                use_linear=use_linear,
            )
add_case("svm_3d_l2", "svm_output", {"data": rs.randn(2, 3, 4), "label": int_labels((2, 3), 4)}, margin=0.7)
add_case("svm_3d_l1", "svm_output", {"data": rs.randn(2, 3, 4), "label": int_labels((2, 3), 4)}, use_linear=True)
add_case("svm_out_of_range", "svm_output", {"data": xs, "label": f32([0, 9, -2, 3, 4.6, 1])}, margin=0.8)

# --------------------------------------------------------------------------- #
# MakeLoss.
# --------------------------------------------------------------------------- #
xm = f32([[0.0, 1.0, -1.0, 0.25], [2.0, 0.5, 0.0, -0.3], [0.7, 0.5, 0.51, 3.0]])
for norm in ("null", "batch", "valid"):
    for thresh in (0.0, 0.5):
        for gs in (1.0, 3.0):
            add_case(
                f"makeloss_{norm}_t{thresh}_gs{gs}",
                "make_loss",
                {"data": xm},
                normalization=norm,
                valid_thresh=thresh,
                grad_scale=gs,
            )
add_case("makeloss_valid_none", "make_loss", {"data": -np.abs(xm) - 1}, normalization="valid", grad_scale=2.0)
xm3 = rs.randn(2, 3, 4)
for norm in ("batch", "valid"):
    add_case(f"makeloss_3d_{norm}", "make_loss", {"data": xm3}, normalization=norm)
add_case("makeloss_1d_batch", "make_loss", {"data": rs.randn(5)}, normalization="batch")

# --------------------------------------------------------------------------- #
# Composite graphs run through a symbol executor: backward() with no head grads.
# --------------------------------------------------------------------------- #
# (a) BlockGrad inside MakeLoss: d/dx MakeLoss(x * BlockGrad(x)) = x.
xb = rs.randn(3, 4)
sx = mx.sym.Variable("x")
sym = mx.sym.MakeLoss(sx * mx.sym.BlockGrad(sx))
exe = sym.simple_bind(mx.cpu(), x=xb.shape, grad_req="write")
exe.arg_dict["x"][:] = f32(xb)
exe.forward(is_train=True)
exe.backward()
arrays["blockgrad_chain/in/x"] = f32(xb)
arrays["blockgrad_chain/out"] = exe.outputs[0].asnumpy()
arrays["blockgrad_chain/grad/x"] = exe.grad_dict["x"].asnumpy()
cases.append({"name": "blockgrad_chain", "op": "graph", "kwargs": {}, "inputs": ["x"], "kind": "graph"})

# (b) A Group of several heads sharing parameters: z = x @ w, then
#     SoftmaxOutput(z, label, batch), LinearRegressionOutput(z, target, gs 0.5),
#     MakeLoss(sum(z * z, axis=1), batch). (MXNet refuses backward() without head
#     gradients when a head is not a loss operator, so every head is one.)
xg, wg = rs.randn(4, 3), rs.randn(3, 5) * 0.5
labg, tg = int_labels((4,), 5), rs.randn(4, 5)
vx, vw = mx.sym.Variable("x"), mx.sym.Variable("w")
vl, vt = mx.sym.Variable("label"), mx.sym.Variable("target")
z = mx.sym.dot(vx, vw)
group = mx.sym.Group(
    [
        mx.sym.SoftmaxOutput(z, vl, normalization="batch"),
        mx.sym.LinearRegressionOutput(z, vt, grad_scale=0.5),
        mx.sym.MakeLoss(mx.sym.sum(z * z, axis=1), normalization="batch"),
    ]
)
exe = group.simple_bind(mx.cpu(), x=xg.shape, w=wg.shape, label=labg.shape, target=tg.shape, grad_req="write")
feed = {"x": xg, "w": wg, "label": labg, "target": tg}
for key, value in feed.items():
    exe.arg_dict[key][:] = f32(value)
exe.forward(is_train=True)
exe.backward()
for key, value in feed.items():
    arrays[f"group/in/{key}"] = f32(value)
    arrays[f"group/grad/{key}"] = exe.grad_dict[key].asnumpy()
for i, out in enumerate(exe.outputs):
    arrays[f"group/out{i}"] = out.asnumpy()
cases.append(
    {
        "name": "group",
        "op": "graph",
        "kwargs": {},
        "inputs": list(feed),
        "kind": "graph",
        "num_outputs": len(exe.outputs),
    }
)

arrays["meta"] = np.array(json.dumps({"mxnet_version": mx.__version__, "cases": cases}))
np.savez_compressed(OUT_PATH, **arrays)
print(f"wrote {len(cases)} cases, {len(arrays)} arrays to {OUT_PATH} ({os.path.getsize(OUT_PATH)} bytes)")
