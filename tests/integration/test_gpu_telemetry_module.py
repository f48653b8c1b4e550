"""gpu_telemetry through ansible-playbook on localhost: AnsiballZ packaging, the detached
sampler outliving the module's own process (and the deleted AnsiballZ zip), check mode, stop by
PID, the samples brought back with ansible.builtin.fetch, and no NVML answered without failing.

The NVML is the fake of tests/fakenvml.py, put in place through
SERVELAB_GPU_TELEMETRY_NVML (the environment ansible-playbook passes to a local module).
"""
import json
import os
import subprocess
import sys
import time

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import still_running

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE = os.path.join(REPO, "tests", "fakenvml.py")

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: check mode starts nothing
      servelab.serving.gpu_telemetry: {{name: t1, state: started, state_dir: "{state_dir}"}}
      check_mode: true
      register: check
    - name: start
      servelab.serving.gpu_telemetry:
        name: t1
        state: started
        state_dir: "{state_dir}"
        interval: 0.05
        max_seconds: 300
        host_label: localhost
        profile: baseline
      register: started
    - name: let it sample
      ansible.builtin.pause: {{seconds: 1}}
    - name: stop
      servelab.serving.gpu_telemetry: {{name: t1, state: stopped, state_dir: "{state_dir}",
                                          return_samples: true}}
      register: stopped
    - name: fetch
      ansible.builtin.fetch: {{src: "{{{{ stopped.path }}}}", dest: "{fetched}", flat: true}}
    - name: stop again
      servelab.serving.gpu_telemetry: {{name: t1, state: stopped, state_dir: "{state_dir}"}}
      register: again
    - name: no GPU here
      servelab.serving.gpu_telemetry: {{name: t2, state: started, state_dir: "{state_dir}"}}
      environment: {{FAKE_NVML_MODE: nogpu}}
      register: nogpu
    - name: keep the results for the test
      ansible.builtin.copy:
        content: "{{{{ {{'check': check, 'started': started, 'stopped': stopped,
                       'again': again, 'nogpu': nogpu}} | to_json }}}}"
        dest: "{out}"
"""


def test_gpu_telemetry_start_and_stop_through_ansible_playbook(tmp_path):
    state_dir = tmp_path / "servers"
    out, fetched = tmp_path / "results.json", tmp_path / "fetched" / "t1.jsonl"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(state_dir=state_dir, out=out, fetched=fetched))
    env = dict(os.environ)
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               SERVELAB_GPU_TELEMETRY_NVML=FAKE)
    env.pop("FAKE_NVML_MODE", None)
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-i", "localhost,", str(playbook)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    results = json.loads(out.read_text()) if out.exists() else {}
    pid = (results.get("started") or {}).get("pid")
    try:
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        check, started, stopped = results["check"], results["started"], results["stopped"]
        assert check["changed"] is True and check["pid"] is None
        assert started["changed"] is True and started["available"] is True and pid
        assert stopped["stopped"] == pid and stopped["survivors"] == []
        assert stopped["available"] is True and stopped["gpus"] == 2 and stopped["samples"] >= 5
        kinds = [r["kind"] for r in stopped["records"]]
        assert kinds[0] == "start" and kinds[-1] == "end" and "sample" in kinds
        assert stopped["records"][0]["host_label"] == "localhost"
        lines = [json.loads(line) for line in fetched.read_text().splitlines()]
        assert len(lines) == len(stopped["records"])
        again = results["again"]
        assert again["changed"] is False and again["stopped"] is None
        nogpu = results["nogpu"]
        assert nogpu.get("failed") is not True and nogpu["available"] is False
        assert "Library Not Found" in nogpu["reason"]
        # the sampler is gone, by its pid
        deadline = time.monotonic() + 5
        while still_running(pid, None) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not still_running(pid, None)
    finally:
        if pid and still_running(pid, None):
            os.kill(pid, 9)
