"""Render and validate Helm charts of functions and tasks (NVCF's ReVal; reference helm-validation.md).

A chart is rendered (``nvcf_mono.helm``), decoded, its kinds checked, its objects sanitized and their
pod specs, volumes and services validated, each rule with NVCF's error text so users can search for
it. The control plane serves it as ``/v1/validate`` and ``/v1/render`` and checks charts with it when
functions are created and deployed; the CLI runs it as ``nvcf-mono helm validate``.
"""
