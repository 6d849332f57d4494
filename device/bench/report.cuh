/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * report.cuh - what the benchmarks write: quantiles of a sample, and one JSON object per
 * measurement (a line of the file bench::json names, when it names one); the command line that
 * names that file.
 */
#ifndef WIC_BENCH_REPORT_CUH
#define WIC_BENCH_REPORT_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace bench {

/* Where record::emit() writes; null: nowhere. */
inline FILE *json = nullptr;

/* The @q quantile of @v (the element at rank q * size), 0 for an empty sample. */
inline double quantile(std::vector<double> v, double q)
{
	if (v.empty())
		return 0.0;
	std::sort(v.begin(), v.end());
	return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

/* One result line: the JSON object's fields. */
class record {
public:
	explicit record(const char *measurement) { add("measurement", measurement); }
	record &add(const char *key, const std::string &value)
	{
		fields_ += (fields_.empty() ? "" : ",") + std::string("\"") + key + "\":\"" + value + "\"";
		return *this;
	}
	record &add(const char *key, const char *value) { return add(key, std::string(value)); }
	record &add(const char *key, double value)
	{
		char text[64];
		snprintf(text, sizeof(text), "%.4g", value);
		fields_ += (fields_.empty() ? "" : ",") + std::string("\"") + key + "\":" + text;
		return *this;
	}
	record &add(const char *key, bool value)
	{
		fields_ += (fields_.empty() ? "" : ",") + std::string("\"") + key + "\":" + (value ? "true" : "false");
		return *this;
	}
	void emit()
	{
		if (json) {
			fprintf(json, "{%s}\n", fields_.c_str());
			fflush(json);
		}
	}

private:
	std::string fields_;
};

/*
 * The command line of a benchmark that takes [--quick] [OUT.jsonl], and [@flag] where given
 * (*@flag_given: whether it was): whether --quick was given; opens OUT as json. Prints the
 * usage and exits 2 on anything else, or 2 if OUT cannot be opened.
 */
inline bool quick_and_output(int argc, char **argv, const char *flag = nullptr, bool *flag_given = nullptr)
{
	bool quick = false;
	const char *out = nullptr;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			quick = true;
		} else if (flag && !strcmp(argv[i], flag)) {
			*flag_given = true;
		} else if (argv[i][0] == '-' || out) {
			fprintf(stderr, "usage: %s [--quick]%s%s%s [OUT.jsonl]\n", argv[0], flag ? " [" : "",
				flag ? flag : "", flag ? "]" : "");
			exit(2);
		} else {
			out = argv[i];
		}
	}
	if (out && !(json = fopen(out, "w"))) {
		perror(out);
		exit(2);
	}
	return quick;
}

} /* namespace bench */

#endif /* WIC_BENCH_REPORT_CUH */
