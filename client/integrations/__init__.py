"""Where orchestrators pick a backend: bashfleet as the execution environment of the
frameworks they run. One module per framework, each a thin layer over `client.Workspace`
/ `client.AsyncWorkspace`, each installed by an extra:

    inspect_ai      pip install 'bashfleet[inspect]'         Task(sandbox="bashfleet")
    harbor          pip install 'bashfleet[harbor]'          harbor run --env ...
    openai_agents   pip install 'bashfleet[openai-agents]'   BashfleetSandboxClient
    swerex_server   pip install 'bashfleet[swerex]'          bashfleet swerex
    mini_swe_agent  pip install 'bashfleet[mini-swe-agent]'  environment_class: ...

The core install pulls none of them; importing this package imports none.
"""


def missing_extra(module: str, framework: str, extra: str,
                  exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error of an adapter imported without its framework: which extra installs it
    (`name` stays the missing module's, as Python's own error has it)."""
    return ModuleNotFoundError(
        f"{module} needs {framework}: pip install 'bashfleet[{extra}]' ({exc})", name=exc.name)
