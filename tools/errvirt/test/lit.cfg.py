# lit configuration of the error-virtualization pass's IR tests: each test
# runs opt-19 with the plugin (--param plugin=PATH, `make errvirt-lit`) and
# checks the output with FileCheck-19.
# ruff: noqa: F821 - lit runs this file with `config` and `lit_config` defined
import os

import lit.formats

config.name = "rekindle-errvirt"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".ll"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["unit"]
config.test_exec_root = lit_config.params.get("exec_root", config.test_source_root)
plugin = lit_config.params.get("plugin")
if not plugin or not os.path.exists(plugin):
    lit_config.fatal(f"reason=plugin_missing: --param plugin=PATH to rekindle-errvirt.so, got {plugin!r}")
config.substitutions.append(("%opt", f"opt-19 -load-pass-plugin={plugin} -passes=rekindle-errvirt,verify"))
config.substitutions.append(("%FileCheck", "FileCheck-19"))
config.environment["PATH"] = os.environ.get("PATH", "")
