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
#: was built), which code in the kernel can forge.
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
        OBSERVED, "output and gradients: data against autograd through SDPA; what is saved for backward and "
                  "kept through ctx: observed, backed by the grader's reading of the source (no autograd hooks, "
                  "nothing loaded changes a module)"),
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
        OBSERVED, "tensors alive at once; on the measured cases of 07 and 08 the grader reads the kernel's memory "
                  "from outside; elsewhere nothing backs it"),
    "autograder.references.masking:padding_mask_off_the_default_device": (
        OBSERVED, "where the result was built; backed by the grader's reading of the source where the exercise "
                  "forbids built-ins, else nothing"),
    "autograder.references.multi_head:parameters_without_grad": (OBSERVED, "the parameters autograd reached; nothing "
                                                                           "in the grader backs it"),
    "autograder.references.decoding_and_training:cache_allocations": (OBSERVED, "bytes allocated; nothing in the "
                                                                                 "grader backs it"),
    "autograder.references.long_context:rolling_bytes_held": (OBSERVED, "bytes held; backed as gradcheck_failure is"),
    "autograder.references.serving:absorbed_allocations": (OBSERVED, "the first large tensor; nothing in the grader "
                                                                      "backs it"),
    "autograder.references.serving:append_allocations": (OBSERVED, "bytes allocated; nothing in the grader backs it"),
    "autograder.references.tiny_decoder:train_block": (OBSERVED, "the losses of a training run in the kernel; backed "
                                                                 "as gradcheck_failure is"),
}
