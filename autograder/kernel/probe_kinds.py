"""What each probe's result is: data the grader judges against a reference, or a property seen in the kernel.

Plain data, read on both sides: the kernel's (:mod:`autograder.kernel.serve`, which runs the probes) and the
grader's (:meth:`autograder.grader.remote.Remote.probe`, which reads the student's source before a probe whose
result is :data:`OBSERVED`, so that nothing loaded in the kernel can have changed what the probe relies on).
"""

from __future__ import annotations

#: A probe's result that the grader compares with a reference: code in the kernel that forges it has computed the
#: right answer.
DATA = "data"
#: A probe's result that is a property seen in the kernel (bytes, counts, saved tensors, forbidden calls, how a result
#: was built), which code in the kernel can forge: before each such probe the grader reads the student's source with
#: the reader's rules (:meth:`autograder.grader.remote.Remote.probe`), whether or not the exercise forbids built-ins.
OBSERVED = "observed"
#: Each probe (``module:qualname``) -> (:data:`DATA` or :data:`OBSERVED`, what the grader checks it against, or that
#: nothing does), so that a new probe is not added without saying (tests/checks/test_probes.py; docs/safety.md).
PROBE_KINDS: dict[str, tuple[str, str]] = {
    "autograder.references.decoding_and_training:cache_scenario": (DATA, "lengths, keys and values against the reference"),
    "autograder.references.long_context:rolling_scenario": (DATA, "lengths, keys, values and positions against the reference"),
    "autograder.references.serving:mla_outputs": (DATA, "outputs and latents against the reference module's, "
                                                        "run under the exercise's rules"),
    "autograder.references.serving:paged_attention_on": (DATA, "the output against the reference"),
    "autograder.references.serving:paged_scenario": (DATA, "every live sequence and the pool against the reference"),
    "autograder.references.serving:paged_attention_error": (DATA, "the error raised against the one the text asks for"),
    "autograder.references.serving:unknown_id_errors": (DATA, "the errors raised against the ones the text asks for"),
    "autograder.references.tiny_decoder:module_parameters": (DATA, "the parameters' names and shapes against the "
                                                                   "text's; the outputs are checked apart"),
    "autograder.references.multi_head:built_module": (DATA, "the class and its parameter count against the text's"),
    "autograder.references.multi_head:module_summary": (DATA, "the class and its parameter count against the text's"),
    "autograder.references.flash_backward:function_record": (
        OBSERVED, "output and gradients: data against autograd through SDPA; what is saved for backward, kept "
                  "through ctx or left alive: observed, backed by the grader's reading of the source (no autograd "
                  "hooks, nothing loaded changes a module)"),
    "autograder.references.flash_backward:function_values": (
        DATA, "outputs at moved inputs and gradients: the grader compares them as gradcheck does"),
    "autograder.references.flash_backward:backward_under_guard": (
        OBSERVED, "the guard; backed by the grader's reading of the source for the forbidden built-ins"),
    "autograder.references.numerical_stability:gradcheck_failure": (
        OBSERVED, "gradcheck in the kernel; backed by the grader's reading of the source (the exercise forbids "
                  "built-ins, so nothing loaded may change a module)"),
    "autograder.references.numerical_stability:unchanged_by": (
        OBSERVED, "whether the input changed; backed as gradcheck_failure is"),
    "autograder.kernel.watches:reductions_of": (OBSERVED, "the reductions made; backed as gradcheck_failure is"),
    "autograder.kernel.watches:watch_allocations": (
        OBSERVED, "tensors alive at once; backed by the grader's reading of the source (nothing loaded changes a "
                  "module or a watch's class); on the measured cases of 07 and 08 the grader also reads the kernel's "
                  "memory from outside"),
    "autograder.references.masking:padding_mask_off_the_default_device": (
        OBSERVED, "where the result was built; backed by the grader's reading of the source (nothing loaded "
                  "changes a module)"),
    "autograder.references.multi_head:parameters_without_grad": (
        OBSERVED, "the parameters autograd's graph reaches (torch.autograd.grad, not .grad, which the module could "
                  "fill in); backed by the grader's reading of the source (nothing loaded changes autograd)"),
    "autograder.references.decoding_and_training:cache_allocations": (
        OBSERVED, "bytes allocated; backed by the grader's reading of the source (nothing loaded changes a module "
                  "or the meter's class)"),
    "autograder.references.long_context:rolling_bytes_held": (OBSERVED, "bytes held; backed as gradcheck_failure is"),
    "autograder.references.serving:absorbed_allocations": (OBSERVED, "the first large tensor; backed as "
                                                                      "cache_allocations is"),
    "autograder.references.serving:append_allocations": (OBSERVED, "bytes allocated; backed as cache_allocations is"),
    "autograder.references.tiny_decoder:train_block": (OBSERVED, "the losses of a training run in the kernel; backed "
                                                                 "as gradcheck_failure is"),
}
