"""The ``register_renderers`` and ``register_commands`` hooks, end to end."""

from __future__ import annotations

import types

import cockpit_basic.plugin
import pytest
import torch

from cockpit_core import Cockpit, CockpitError, Registry, hookimpl, read_log
from cockpit_core.cli.main import main
from cockpit_core.errors import DuplicateNameError, UnknownRendererError
from cockpit_core.plugin import registry as registry_module


def _csv_renderer(calls):
    """A renderer that writes the losses of a Cockpit or a log as ``step,loss`` lines."""

    def render(source, path=None, **options):
        calls.append((source, path, options))
        if isinstance(source, Cockpit):
            losses = {step: values["loss"] for step, values in source.get_output().items()}
        else:
            losses = {int(s): v["loss"] for s, v in read_log(source).items()}
        text = "".join(f"{step},{loss!r}\n" for step, loss in sorted(losses.items()))
        if path is None:
            return text
        path.write_text(text) if hasattr(path, "write_text") else open(path, "w").write(text)
        return path

    return render


def _plugin(**hooks):
    plugin = types.SimpleNamespace()
    for name, function in hooks.items():
        setattr(plugin, name, hookimpl(function))
    return plugin


def _registry(*plugins):
    registry = Registry()
    registry.add_plugin(cockpit_basic.plugin, name="basic", distribution="cockpit-basic")
    for i, plugin in enumerate(plugins):
        registry.add_plugin(plugin, name=f"p{i}", distribution=f"dist-{i}")
    return registry


def _train(registry, tmp_path, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model.parameters(), ["loss"], registry=registry, log=tmp_path / "run.jsonl")
    losses = {}
    for step in range(steps):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss}):
            loss.backward()
        losses[step] = loss.item()
        opt.step()
        opt.zero_grad()
    return cp, losses


def test_hook_register_renderers(tmp_path, monkeypatch, capsys):
    calls = []

    def register_renderers(register):
        register(".CSV", _csv_renderer(calls), "losses as a table")

    registry = _registry(_plugin(register_renderers=register_renderers))
    assert registry.plugins[-1].renderers == [".csv"]  # suffixes are case-insensitive
    cp, losses = _train(registry, tmp_path)

    # Cockpit.plot picks the renderer by the suffix and passes the options on
    out = cp.plot(tmp_path / "losses.Csv", title="t")
    rows = [line.split(",") for line in out.read_text().splitlines()]
    assert [int(s) for s, _ in rows] == [0, 1, 2]
    assert [float(v) for _, v in rows] == pytest.approx([losses[s] for s in range(3)], rel=1e-6)
    assert calls[-1][0] is cp and calls[-1][2] == {"title": "t"}
    cp.close()

    # `cockpit plot LOG -o OUT` reaches it too, with the log's path
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    assert main(["plot", str(tmp_path / "run.jsonl"), "-o", str(tmp_path / "cli.csv")]) == 0
    assert (tmp_path / "cli.csv").read_text() == out.read_text()
    assert calls[-1][0] == str(tmp_path / "run.jsonl")
    assert "written to" in capsys.readouterr().out

    # an unknown suffix names the installed ones
    with pytest.raises(UnknownRendererError, match=r"Unknown file type '\.xyz'.*\.csv"):
        registry.renderer("a.xyz")


def test_a_bad_or_clashing_renderer_costs_only_the_renderers():
    def bad(register):
        register("csv", lambda source, path=None: path)  # no dot

    def good(register):
        register(".svgz", lambda source, path=None: path)

    def clash(register):
        register(".svgz", lambda source, path=None: path)

    with pytest.warns(UserWarning, match="register_renderers raised TypeError"):
        registry = _registry(_plugin(register_renderers=bad))
    assert "loss" in registry.quantities and not list(registry.renderers.items())
    assert "suffix must be a dot" in registry.extension_errors["p0"]

    registry = _registry(_plugin(register_renderers=good), _plugin(register_renderers=clash))
    assert "renderer:.svgz" in registry.conflicts
    with pytest.raises(DuplicateNameError):
        registry.renderer("x.svgz")


def test_hook_register_commands(monkeypatch, capsys):
    seen = []

    def configure(parser):
        parser.description = "Say hello to someone."
        parser.add_argument("--name", required=True)

    def run(args):
        seen.append(args.name)
        if args.name == "nobody":
            raise CockpitError("nobody is there")
        if args.name == "":
            args.usage_error("argument --name: empty")
        print(f"hello {args.name}")
        return 3

    def register_commands(register):
        register("hello", configure, run, help="say hello")

    registry = _registry(_plugin(register_commands=register_commands))
    assert registry.plugins[-1].commands == ["hello"]
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)

    assert main(["hello", "--name", "ada"]) == 3
    assert capsys.readouterr().out == "hello ada\n"
    assert main(["hello", "--name", "nobody"]) == 1  # a CockpitError: a message, exit 1
    assert capsys.readouterr().err == "error: nobody is there\n"
    with pytest.raises(SystemExit) as exit_:
        main(["hello", "--name", ""])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        main(["hello", "--help"])
    assert "Say hello to someone." in capsys.readouterr().out
    assert seen == ["ada", "nobody", ""]


def test_core_commands_need_no_plugin_and_cannot_be_taken(monkeypatch, capsys):
    def take_plot(register):
        register("plot", lambda parser: None, lambda args: 0)

    with pytest.warns(UserWarning, match="'cockpit plot' is a command of the core"):
        registry = _registry(_plugin(register_commands=take_plot))
    assert not list(registry.commands.items()) and "loss" in registry.quantities

    def no_plugins():
        raise AssertionError("the core's commands and --help load no plugin")

    monkeypatch.setattr(registry_module, "default_registry", no_plugins)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "cockpit plugins" in capsys.readouterr().out  # where plugin commands are listed
    with pytest.raises(SystemExit) as exit_:
        main(["plot", "--help"])  # a core command's parser: no plugin either
    assert exit_.value.code == 0


def test_a_command_whose_configure_raises_is_skipped_with_a_warning(monkeypatch, capsys):
    def broken(parser):
        raise RuntimeError("no arguments today")

    def register_commands(register):
        register("broken", broken, lambda args: 0)
        register("fine", lambda parser: None, lambda args: None)  # None: exit code 0

    registry = _registry(_plugin(register_commands=register_commands))
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    assert main(["fine"]) == 0
    assert "command 'broken' of dist-0 is skipped" in capsys.readouterr().err
