# lit configuration of the fault-injection pass's IR tests: each test runs
# opt-19 with the plugin (--param plugin=PATH, `make faultinject-lit`) and
# checks the output with FileCheck-19.
# ruff: noqa: F821 - lit runs this file with `config` and `lit_config` defined
import os

import lit.formats

config.name = "rekindle-faultinject"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".ll"]
config.test_source_root = os.path.dirname(__file__)
# lit's Output/ directories go to the build tree, not next to the tests.
config.test_exec_root = lit_config.params.get("exec_root", config.test_source_root)
plugin = lit_config.params.get("plugin")
if not plugin or not os.path.exists(plugin):
    lit_config.fatal(f"reason=plugin_missing: --param plugin=PATH to rekindle-faultinject.so, got {plugin!r}")
opt = f"opt-19 -load-pass-plugin={plugin} -passes=rekindle-faultinject,verify"
config.substitutions.append(("%opt", opt))
config.substitutions.append(("%FileCheck", "FileCheck-19"))
config.environment["PATH"] = os.environ.get("PATH", "")
