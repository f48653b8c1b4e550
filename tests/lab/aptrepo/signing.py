"""A throw-away OpenPGP signing key for the test APT repositories (GnuPG in a private home).

The key lives in a temporary GNUPGHOME that the caller owns; `close()` stops the gpg-agent that
GnuPG starts for that home (by home directory, through gpgconf), so no process outlives the test.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

GPG_TIMEOUT = 120


class SigningError(RuntimeError):
    """gpg is missing or failed; the message says which command and why."""


class SigningKey:
    """An ed25519 signing key generated on construction, in `home` (created, 0700)."""

    def __init__(self, home: Path, uid: str = "servelab lab archive <lab@servelab.invalid>"):
        if shutil.which("gpg") is None:
            raise SigningError("gpg not found: install the Debian package gpg (apt-get install gpg)")
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)
        self.uid = uid
        self._gpg("--quick-generate-key", uid, "ed25519", "sign", "1d")
        listing = self._gpg("--with-colons", "--list-secret-keys", uid).stdout
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def _gpg(self, *args: str, input_bytes: bytes | None = None) -> subprocess.CompletedProcess:
        argv = ["gpg", "--homedir", str(self.home), "--batch", "--yes", "--no-tty", "--quiet",
                "--pinentry-mode", "loopback", "--passphrase", ""] + list(args)
        try:
            result = subprocess.run(argv, input=input_bytes, capture_output=True, timeout=GPG_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as err:
            raise SigningError("gpg timed out after %ss: %s" % (GPG_TIMEOUT, " ".join(args))) from err
        if result.returncode != 0:
            raise SigningError("gpg %s failed (rc %d): %s" % (" ".join(args[:2]), result.returncode,
                                                              result.stderr.decode(errors="replace")))
        return subprocess.CompletedProcess(argv, 0, result.stdout.decode(errors="replace"),
                                           result.stderr.decode(errors="replace"))

    def public_key_armored(self) -> str:
        return self._gpg("--armor", "--export", self.fingerprint).stdout

    def public_key_binary(self) -> bytes:
        argv = ["gpg", "--homedir", str(self.home), "--batch", "--export", self.fingerprint]
        return subprocess.run(argv, capture_output=True, check=True, timeout=GPG_TIMEOUT).stdout

    def clearsign(self, source: Path, dest: Path) -> None:
        self._gpg("--local-user", self.fingerprint, "--digest-algo", "SHA512", "--clearsign",
                  "--output", str(dest), str(source))

    def detach_sign(self, source: Path, dest: Path) -> None:
        self._gpg("--local-user", self.fingerprint, "--digest-algo", "SHA512", "--armor",
                  "--detach-sign", "--output", str(dest), str(source))

    def close(self) -> None:
        """Stop the gpg-agent of this home (started by gpg on first use)."""
        if shutil.which("gpgconf"):
            subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "all"],
                           capture_output=True, timeout=GPG_TIMEOUT, check=False)

    def __enter__(self) -> SigningKey:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
