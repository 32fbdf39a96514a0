#pragma once
// What Hugging Face's DebugUnderflowOverflow prints as "not a tensor" in a module's arguments or
// result (a ModelOutput, a dict, a list, a cache object), and the tensors inside, each named by the
// path that reaches it from Python ("output.logits", "input[1].layers[0].keys").
#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

namespace sentinel {
namespace python {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Whether HF's report shows "not a tensor" somewhere in a forward's positional `arguments` (a
// tuple: each element) or in its `result` (the result itself, the elements of a tuple, or those of
// a tuple inside it), as its hooks look.
bool has_opaque_arguments(pybind11::handle arguments);
bool opaque_result(pybind11::handle result);
// The tensors inside the arguments that are "not a tensor" to HF ("input[1].layers[0].keys"); the
// tensor arguments themselves are read by the ops that use them.
void opaque_arguments(pybind11::handle arguments, NamedTensors& out);

// The tensors in `value`, named from `root`: "[i]" into tuples and lists, ".key" into a ModelOutput
// (a dict whose keys are attributes), "['key']" into other dicts, ".attribute" into other objects'
// public attributes (a Cache's layers, a layer's keys and values); modules, types and callables
// are not entered. A few levels deep, and a bounded number of tensors.
void named_tensors(pybind11::handle value, const std::string& root, NamedTensors& out);

}  // namespace python
}  // namespace sentinel
