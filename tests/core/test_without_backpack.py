"""cockpit-core without BackPACK: imports, trains with module hooks, names what to install."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import warnings

    class HideBackpack:  # as if backpack-for-pytorch and the curvature providers were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("backpack", "cockpit_backpack", "cockpit_autodiff"):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, HideBackpack())

    import torch
    from cockpit_core import Cockpit
    from cockpit_core.testing import tiny_mlp

    problem = tiny_mlp()
    model = problem.make_model()  # not extended: there is no BackPACK
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp = Cockpit(model, ["norm_test", "tic_diag"])
    print("WARNING:", *[str(w.message) for w in caught if "provider" in str(w.message)])
    x, y = problem.batch(0)
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    losses = torch.nn.functional.cross_entropy(out, y, reduction="none").detach()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cp(0, info={"loss": loss, "individual_losses": losses, "batch_size": len(x)}):
            loss.backward()
    print("OUTPUT:", sorted(cp.get_output()[0]))
    print("ERROR:", cp.errors[0]["quantity"], cp.errors[0]["error"])
    print("LOADED:", sorted(m for m in sys.modules if m.split(".")[0] == "backpack"))
    """
)


def test_core_works_without_backpack_and_names_the_distribution_to_install():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in run.stdout.splitlines()
    }
    assert (
        "no installed statistics provider computes diag_hessian, which 'tic_diag' needs"
        in lines["WARNING"]
    )
    assert "pip install cockpit-backpack" in lines["WARNING"]
    assert lines["OUTPUT"] == "['norm_test']"  # module hooks computed it
    assert lines["ERROR"].startswith("tic_diag UnsupportedModelError: No installed provider")
    assert "pip install cockpit-backpack" in lines["ERROR"]
    assert lines["LOADED"] == "[]"
