"""Uploading an exported folder to a model hub repository (``flowrl export --push-to-hub``) with huggingface_hub.

Every way it cannot happen is one line before anything is sent: offline mode (``HF_HUB_OFFLINE``), no token
(``HF_TOKEN`` or a stored ``hf auth login``), an id that is no ``owner/name``; a refusal by the hub or a lost
connection is one line too, and the folder stays as it was written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from flowrl.core.errors import UserError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubError(UserError):
    """An upload that cannot be made: one line, exit status 2 (the exported folder is kept)."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def ready(repo: str, folder: Path) -> str:
    """The token an upload of ``folder`` to ``repo`` would use; a :class:`HubError` for an id that is no
    ``owner/name``, offline mode or no token (checked before the export, so nothing waits for a refusal)."""
    if not REPO_ID.match(repo):
        raise HubError(f"--push-to-hub {repo!r}: expected a repository id OWNER/NAME")
    if _offline():
        raise HubError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so nothing can be uploaded; export without"
                       f" --push-to-hub and upload {folder} later with `hf upload`, or unset HF_HUB_OFFLINE")
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise HubError(f"--push-to-hub {repo}: no Hugging Face token; set HF_TOKEN or run `hf auth login`")
    return token


def push_folder(folder: Path, repo: str, private: bool = False) -> str:
    """Create ``repo`` (a model repository) if needed and upload ``folder`` to it; returns the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=ready(repo, folder))
    try:
        url = api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, repo_type="model", folder_path=str(folder),
                          commit_message="Upload a flowrl export")
    except Exception as error:  # HTTP refusals, lost connections: one line naming the cause, the folder kept
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise HubError(f"--push-to-hub {repo}: the upload failed ({first}); the folder {folder} is written") from None
    return str(url)
