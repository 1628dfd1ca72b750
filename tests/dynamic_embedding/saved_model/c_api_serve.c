/* Serves one SavedModel signature through TensorFlow's C API, the C++ runtime that
 * tensorflow_model_server embeds: LoadSavedModel with the "serve" tag (variables and lookup
 * tables restored by the SavedModel's own restore op), then one Session::Run. No Python, no
 * tf_ext: an op the export needs but stock TensorFlow lacks fails the load.
 *
 *   c_api_serve EXPORT_DIR OUTPUT_TENSOR INPUT...
 *
 * Each INPUT is TENSOR=TYPE:COLUMNS:V1,V2,... with TYPE int64 or string; the values are fed as a
 * [n] vector (COLUMNS 0) or an [n, COLUMNS] matrix. OUTPUT_TENSOR (float) is printed, one value
 * per line. Tensor names are "operation:index", as in a SignatureDef. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/tf_tstring.h"

enum { kMaxInputs = 8, kMaxValues = 1024 };

static int Fail(const char* what, TF_Status* status) {
  fprintf(stderr, "%s: %s\n", what, TF_Message(status));
  return 1;
}

/* "operation:index" -> TF_Output of `graph`; index 0 when absent. */
static int Lookup(TF_Graph* graph, const char* name, size_t length, TF_Output* out) {
  char operation[512];
  const char* colon = memchr(name, ':', length);
  size_t op_length = colon ? (size_t)(colon - name) : length;
  if (op_length >= sizeof(operation)) return 0;
  memcpy(operation, name, op_length);
  operation[op_length] = '\0';
  out->oper = TF_GraphOperationByName(graph, operation);
  out->index = colon ? atoi(colon + 1) : 0;
  return out->oper != NULL;
}

/* Parses TENSOR=TYPE:COLUMNS:V1,V2,... into a tensor fed at `input`; NULL on bad syntax. */
static TF_Tensor* ParseInput(TF_Graph* graph, char* spec, TF_Output* input) {
  char* equals = strchr(spec, '=');
  if (!equals || !Lookup(graph, spec, (size_t)(equals - spec), input)) return NULL;
  char* type = equals + 1;
  char* columns_text = strchr(type, ':');
  if (!columns_text) return NULL;
  *columns_text++ = '\0';
  char* values_text = strchr(columns_text, ':');
  if (!values_text) return NULL;
  *values_text++ = '\0';
  int64_t columns = strtoll(columns_text, NULL, 10);

  char* values[kMaxValues];
  int64_t count = 0;
  for (char* value = strtok(values_text, ","); value && count < kMaxValues;
       value = strtok(NULL, ",")) {
    values[count++] = value;
  }
  int64_t dims[2] = {columns > 0 ? count / columns : count, columns};
  int rank = columns > 0 ? 2 : 1;
  if (strcmp(type, "int64") == 0) {
    TF_Tensor* tensor = TF_AllocateTensor(TF_INT64, dims, rank, count * sizeof(int64_t));
    int64_t* data = (int64_t*)TF_TensorData(tensor);
    for (int64_t i = 0; i < count; ++i) data[i] = strtoll(values[i], NULL, 10);
    return tensor;
  }
  if (strcmp(type, "string") == 0) {
    TF_Tensor* tensor = TF_AllocateTensor(TF_STRING, dims, rank, count * sizeof(TF_TString));
    TF_TString* data = (TF_TString*)TF_TensorData(tensor);
    for (int64_t i = 0; i < count; ++i) {
      TF_StringInit(&data[i]);
      TF_StringCopy(&data[i], values[i], strlen(values[i]));
    }
    return tensor;
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 4 || argc - 3 > kMaxInputs) {
    fprintf(stderr, "usage: %s EXPORT_DIR OUTPUT_TENSOR TENSOR=TYPE:COLUMNS:V1,V2,...\n", argv[0]);
    return 2;
  }
  TF_Status* status = TF_NewStatus();
  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  TF_Session* session =
      TF_LoadSessionFromSavedModel(options, NULL, argv[1], tags, 1, graph, NULL, status);
  if (TF_GetCode(status) != TF_OK) return Fail("LoadSavedModel", status);

  TF_Output output;
  if (!Lookup(graph, argv[2], strlen(argv[2]), &output)) {
    fprintf(stderr, "no tensor %s in the graph\n", argv[2]);
    return 1;
  }
  int num_inputs = argc - 3;
  TF_Output inputs[kMaxInputs];
  TF_Tensor* feeds[kMaxInputs];
  for (int i = 0; i < num_inputs; ++i) {
    feeds[i] = ParseInput(graph, argv[3 + i], &inputs[i]);
    if (!feeds[i]) {
      fprintf(stderr, "bad input %s (TENSOR=int64|string:COLUMNS:V1,V2,...)\n", argv[3 + i]);
      return 2;
    }
  }

  TF_Tensor* result = NULL;
  TF_SessionRun(session, NULL, inputs, feeds, num_inputs, &output, &result, 1, NULL, 0, NULL,
                status);
  if (TF_GetCode(status) != TF_OK) return Fail("Session::Run", status);
  if (TF_TensorType(result) != TF_FLOAT) {
    fprintf(stderr, "output is not float\n");
    return 1;
  }
  const float* rows = (const float*)TF_TensorData(result);
  size_t n = TF_TensorByteSize(result) / sizeof(float);
  for (size_t i = 0; i < n; ++i) printf("%.9g\n", rows[i]);

  for (int i = 0; i < num_inputs; ++i) TF_DeleteTensor(feeds[i]);
  TF_DeleteTensor(result);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  return 0;
}
