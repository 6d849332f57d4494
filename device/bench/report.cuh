/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * report.cuh - what the benchmarks write: quantiles of a sample, and one JSON object per
 * measurement (a line of the file bench::json names, when it names one).
 */
#ifndef WIC_BENCH_REPORT_CUH
#define WIC_BENCH_REPORT_CUH

#include <algorithm>
#include <cstdio>
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

} /* namespace bench */

#endif /* WIC_BENCH_REPORT_CUH */
