"""llm_server's DOCUMENTATION and its argument_spec say the same thing (ansible-doc is what users
read; the argument_spec is what runs)."""
import yaml

from ansible_collections.servelab.serving.plugins.modules import llm_server
from ansible_collections.servelab.serving.plugins.module_utils.server.manager import ServerRequest
from ansible_collections.servelab.serving.plugins.module_utils.server.render import ENGINES


def test_documented_options_match_the_argument_spec():
    documented = yaml.safe_load(llm_server.DOCUMENTATION)["options"]
    spec = llm_server.ARGUMENT_SPEC
    assert set(documented) == set(spec)
    for name, option in spec.items():
        doc = documented[name]
        assert doc["type"] == option["type"], name
        assert doc.get("default") == option.get("default"), name
        assert doc.get("choices") == option.get("choices"), name
        assert bool(doc.get("required")) == bool(option.get("required")), name
    assert documented["engine"]["choices"] == list(ENGINES)


def test_every_option_is_a_request_field():
    fields = set(ServerRequest.__dataclass_fields__)
    assert set(llm_server.ARGUMENT_SPEC) <= fields


def test_examples_and_return_are_yaml():
    assert isinstance(yaml.safe_load(llm_server.EXAMPLES), list)
    returned = yaml.safe_load(llm_server.RETURN)
    for key in ("cmd", "cmdline", "env", "config_hash", "base_url", "model", "features_skipped",
                "engine_version", "ready_seconds", "log_path"):
        assert key in returned
