# -*- coding: utf-8 -*-
"""Filters of the rolling upgrade (playbooks/gpu_stack.yml): its batch size and failure budget,
validated where the play reads them (the play keywords `serial` and `max_fail_percentage`), so a
typo stops the play before any host is touched, with a message naming the variable and the fix.

Pure functions, unit-tested in tests/unit/test_rollout_filters.py.
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _one_batch(value, name: str):
    """A positive host count (3) or a share of the play's hosts ('25%')."""
    if isinstance(value, bool):
        raise AnsibleFilterError("%s: %r is not a batch size" % (name, value))
    text = str(value).strip()
    match = PERCENT_RE.match(text)
    if match:
        share = float(match.group(1))
        if not 0 < share <= 100:
            raise AnsibleFilterError("%s: %s is not a share of the hosts in (0%%, 100%%]" % (name, text))
        return text.replace(" ", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise AnsibleFilterError("%s: %r is not a batch size" % (name, value))


def rollout_serial(value, name="gpu_stack_serial"):
    """How many hosts are upgraded at a time: a positive integer, a percentage ('25%') or a list of
    them (a ramp: [1, 5, '50%'], the last repeated). Returned as Ansible's `serial` wants it."""
    fix = ("set %s to a positive number of hosts (1: one at a time), a percentage of the hosts "
           "('25%%') or a list of them ([1, 5, '50%%']), e.g. -e %s=2" % (name, name))
    try:
        if isinstance(value, (list, tuple)):
            if not value:
                raise AnsibleFilterError("%s: an empty list" % name)
            return [_one_batch(item, name) for item in value]
        return _one_batch(value, name)
    except AnsibleFilterError as err:
        raise AnsibleFilterError("%s; %s" % (err.message, fix)) from None


def rollout_max_fail_percentage(value, name="gpu_stack_max_fail_percentage"):
    """The share of a batch's hosts that may fail before the rollout stops: 0 (the default) stops
    at the first failed host. Whatever the share, Ansible ends the play when every host of a batch
    failed (ansible-core 2.19 executor/playbook_executor.py:198-204, `len(batch) == failed_hosts_count`),
    so 100 goes on past a batch only while some host of it succeeded, and at serial 1, where a failed
    host is a whole failed batch, every value stops at the first failed host."""
    fix = ("set %s to a number from 0 (stop at the first failed host) to 100 (go on unless a whole batch "
           "failed), e.g. -e %s=0" % (name, name))
    if isinstance(value, bool):
        raise AnsibleFilterError("%s: %r is not a percentage; %s" % (name, value, fix))
    try:
        number = float(str(value).strip().rstrip("%"))
    except ValueError:
        raise AnsibleFilterError("%s: %r is not a percentage; %s" % (name, value, fix)) from None
    if not 0 <= number <= 100:
        raise AnsibleFilterError("%s: %s is outside 0..100; %s" % (name, value, fix))
    return int(number) if number == int(number) else number


class FilterModule:
    def filters(self):
        return {
            "rollout_serial": rollout_serial,
            "rollout_max_fail_percentage": rollout_max_fail_percentage,
        }
