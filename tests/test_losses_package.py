"""funcnet.losses is a package of private family modules behind one public namespace.

``funcnet.losses`` is the one import path of every loss: the family modules are private,
each loss is named after ``funcnet.losses`` (reprs, pickles, doctest and the API page all
find it there), and the modules share only the package's helper modules.
"""

import ast
import pathlib
import pickle
import pkgutil

import jax.numpy as jnp

from funcnet import losses

PACKAGE = pathlib.Path(losses.__file__).parent
HELPERS = {"_args", "_reduction"}  # the shared private helpers every family may use

# The public names before the split into a package (funcnet 0.1's losses.py), in order,
# then the losses added with it.
BEFORE_THE_SPLIT = [
    "cross_entropy",
    "nll_loss",
    "sigmoid_binary_cross_entropy",
    "mse",
    "mae",
    "huber",
    "hinge",
    "multiclass_hinge",
    "smooth_l1",
    "center_loss_init",
    "center_loss",
    "binary_cross_entropy",
    "kl_div",
    "cosine_embedding_loss",
    "margin_ranking_loss",
    "triplet_margin_loss",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "ctc_loss",
]
ADDED = ["soft_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "hinge_embedding_loss"]


def _submodules():
    return sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE)]))


def test_public_names_are_kept():
    assert losses.__all__ == BEFORE_THE_SPLIT + ADDED
    for name in losses.__all__:
        assert callable(getattr(losses, name)), name


def test_submodules_are_private_and_each_loss_lives_in_one():
    modules = _submodules()
    assert len(modules) >= 5 and HELPERS <= set(modules)
    assert [m for m in modules if not m.startswith("_")] == []
    homes = {}
    for name in modules:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for public in losses.__all__:
            if public in defined:
                homes.setdefault(public, []).append(name)
    assert sorted(homes) == sorted(losses.__all__)
    assert {k: v for k, v in homes.items() if len(v) != 1} == {}


def test_losses_are_named_after_the_package():
    for name in losses.__all__:
        fn = getattr(losses, name)
        assert fn.__module__ == "funcnet.losses", name
        assert pickle.loads(pickle.dumps(fn)) is fn


def test_families_import_only_the_helpers_and_no_other_family():
    found = []
    for name in _submodules():
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("funcnet.losses"):
                # a family's privates stay its own: only the helpers are shared
                if node.module.rpartition(".")[2] not in HELPERS:
                    found.append(f"{name} imports {node.module}")
            if isinstance(node, ast.Import) and any(a.name.startswith("funcnet.losses") for a in node.names):
                found.append(f"{name} imports the package")
    assert found == []


def test_helpers_export_nothing():
    from funcnet.losses import _args, _reduction

    assert _args.__all__ == [] and _reduction.__all__ == []


def test_the_package_reexports_each_family_exactly():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported.setdefault(node.module.rpartition(".")[2], set()).update(a.name for a in node.names)
    for name in _submodules():
        if name in HELPERS:
            assert name not in imported
            continue
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        exported = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
        )
        assert imported.get(name) == set(exported), name


def test_a_loss_still_computes_through_the_package():
    # The re-export is the function itself, not a wrapper.
    assert float(losses.mse(jnp.array([1.0, 3.0]), jnp.array([0.0, 0.0]))) == 5.0
