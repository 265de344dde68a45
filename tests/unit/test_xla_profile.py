"""loadtest.xla_profile's pure pieces: HLO text parsed, ops classified, exclusive times."""

from __future__ import annotations

from types import SimpleNamespace

from loadtest.xla_profile import KINDS, Classifier, exclusive_times, frame_functions

HLO = """HloModule jit_step, is_scheduled=true

FileNames
1 "/repo/replicas/model/layers.py"

FunctionNames
1 "RMSNorm.__call__"
2 "attend_dense"
3 "CausalLM.label_logprobs"
4 "DecoderLayer.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=60 end_line=60 column=1 end_column=9}
2 {file_name_id=1 function_name_id=2 line=120 end_line=120 column=1 end_column=9}
3 {file_name_id=1 function_name_id=3 line=300 end_line=300 column=1 end_column=9}
4 {file_name_id=1 function_name_id=4 line=150 end_line=150 column=1 end_column=9}

StackFrames
1 {file_location_id=4 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=1}
3 {file_location_id=2 parent_frame_id=1}
4 {file_location_id=3 parent_frame_id=4}


%fused_norm (param_0: f32[16,576]) -> f32[16,576] {
  %param_0 = f32[16,576]{1,0} parameter(0)
  ROOT %multiply.1 = f32[16,576]{1,0} multiply(%param_0, %param_0), metadata={op_name="x" stack_frame_id=2}
}

%fused_proj (param_0: f32[16,576], param_1: f32[576,192]) -> f32[16,192] {
  %param_0 = f32[16,576]{1,0} parameter(0)
  %param_1 = f32[576,192]{1,0} parameter(1)
  ROOT %dot.1 = f32[16,192]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="x" stack_frame_id=1}
}

%fused_scores (param_0: f32[3,16,64], param_1: f32[3,16,64]) -> f32[3,16,16] {
  %param_0 = f32[3,16,64]{2,1,0} parameter(0)
  %param_1 = f32[3,16,64]{2,1,0} parameter(1)
  ROOT %dot.2 = f32[3,16,16]{2,1,0} dot(%param_0, %param_1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}, metadata={op_name="x" stack_frame_id=3}
}

ENTRY %main (p0: f32[16,576], p1: f32[576,192], p2: f32[3,16,64], p3: f32[32,49152]) -> f32[32,49152] {
  %p0 = f32[16,576]{1,0} parameter(0)
  %p1 = f32[576,192]{1,0} parameter(1)
  %p2 = f32[3,16,64]{2,1,0} parameter(2)
  %p3 = f32[32,49152]{1,0} parameter(3)
  %norm_fusion = f32[16,576]{1,0} fusion(%p0), kind=kLoop, calls=%fused_norm
  %ynn_fusion = f32[16,192]{1,0} fusion(%norm_fusion, %p1), kind=kCustom, calls=%fused_proj
  %ynn_fusion.1 = f32[3,16,16]{2,1,0} fusion(%p2, %p2), kind=kCustom, calls=%fused_scores
  %copy.3 = f32[16,576]{1,0} copy(%p0)
  %convert.1 = bf16[16,576]{1,0} convert(%p0)
  ROOT %exponential.1 = f32[32,49152]{1,0} exponential(%p3), metadata={op_name="x" stack_frame_id=4}
}
"""  # noqa: E501 (HLO lines as XLA prints them)


def test_frames_name_their_function_and_the_frames_around_them() -> None:
    frames = frame_functions(HLO)
    assert frames[2] == {"RMSNorm.__call__", "DecoderLayer.__call__"}
    assert frames[4] == {"CausalLM.label_logprobs"}  # its own parent: no cycle


def test_each_op_gets_its_kind_from_opcodes_shapes_and_functions() -> None:
    kind = Classifier(HLO, vocab=49152).kind
    assert kind("norm_fusion") == "norms"
    assert kind("ynn_fusion") == "projection matmuls"
    assert kind("ynn_fusion.1").startswith("attention")
    assert kind("exponential.1").startswith("LM head")
    assert kind("copy.3").startswith("copies")
    assert kind("convert.1") == "converts"
    assert kind("not-in-the-module") in KINDS


def test_exclusive_time_is_each_event_less_the_events_inside_it() -> None:
    event = lambda name, start, length: SimpleNamespace(  # noqa: E731
        name=name, start_ns=start, duration_ns=length
    )
    events = [event("while", 0, 100), event("a", 10, 30), event("b", 50, 20), event("c", 200, 5)]
    assert sorted(exclusive_times(events)) == sorted(
        [("while", 50e-9), ("a", 30e-9), ("b", 20e-9), ("c", 5e-9)]
    )
