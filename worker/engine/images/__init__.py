"""OCI images on this host: pulled or built, held once, unpacked for workspaces to stand
on, collected when unused (`images`); what an image is, decided without running a tool
(`image_meta`); the tools that do the work, skopeo, umoci and buildah (`image_tools`);
and the namespaces a Dockerfile's RUN steps run in (`build_isolation`).
"""
